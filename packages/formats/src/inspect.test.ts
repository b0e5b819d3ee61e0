// What `inspect` reports about a safetensors file's __metadata__ (every value in full, JSON indented,
// long values cut with their length) and the layout's name source without development-note paths.
import { afterAll, expect, test } from "bun:test";
import { join } from "node:path";
import { inspectCheckpoint, namesSource, renderInspect } from "./inspect.ts";
import { KREA2_DIT_NAMES, QWEN_IMAGE_21_TRANSFORMER_NAMES } from "./layouts/diffusion.ts";
import { GGUF_HF_NAMES } from "./layouts/gguf-llm.ts";
import { QWEN3VL_TEXT_NAMES } from "./layouts/text-encoder.ts";
import { QWEN_IMAGE_21_VAE_NAMES, WAN21_VAE_NAMES } from "./layouts/vae.ts";
import { writeSafetensors } from "./safetensors/write.ts";
import { tempDir } from "./testing/util.ts";

const tmp = tempDir("inspect");
afterAll(tmp.cleanup);

test("a safetensors file's __metadata__: every value whole, JSON objects indented below the key", () => {
  const path = join(tmp.dir, "meta.safetensors");
  const long = "x".repeat(4100);
  const note = "two\nlines and a long tail ".padEnd(150, ".");
  writeSafetensors(path, [{ name: "w", dtype: "F32", shape: [2], data: new Uint8Array(8) }], {
    metadata: {
      format: "pt",
      config: '{"hidden_size": 256, "num_attention_heads": [2, 4]}',
      note,
      long,
    },
  });
  const report = inspectCheckpoint(path);
  expect(report.metadata.long).toEqual({ type: "str", value: long }); // --json: always whole
  const text = renderInspect(report).split("\n");
  const start = text.indexOf("__metadata__ (4):");
  expect(start).toBeGreaterThan(0);
  expect(text.slice(start + 1, text.indexOf("", start))).toEqual([
    "  format  pt",
    "  config",
    "    {",
    '      "hidden_size": 256,',
    '      "num_attention_heads": [',
    "        2,",
    "        4",
    "      ]",
    "    }",
    `  note    ${note.replace("\n", "\\n")}`, // past the 100 characters a GGUF string shows
    `  long    ${"x".repeat(4000)}… (4100 chars; --json shows it whole)`,
  ]);
});

test("a file without __metadata__ says so; GGUF keys keep their own table", () => {
  const path = join(tmp.dir, "bare.safetensors");
  writeSafetensors(path, [{ name: "w", dtype: "F32", shape: [1], data: new Uint8Array(4) }]);
  expect(renderInspect(inspectCheckpoint(path))).toContain("\n__metadata__ (0):\n\ntensors (1, 4 B):");
});

test("name sources name the upstream code only, never a path into ../shared", () => {
  expect(namesSource(KREA2_DIT_NAMES.source)).toBe("ComfyUI comfy/ldm/krea2/model.py names");
  expect(namesSource(WAN21_VAE_NAMES.source)).toBe("ComfyUI comfy/ldm/wan/vae.py names");
  expect(namesSource(QWEN3VL_TEXT_NAMES.source)).toBe(
    "transformers modeling_qwen3_vl.py; ComfyUI comfy/text_encoders/qwen3vl.py",
  );
  expect(namesSource("ggml-org/llama.cpp src/llama-arch.cpp (LLM_TENSOR_NAMES)")).toBe(
    "ggml-org/llama.cpp src/llama-arch.cpp (LLM_TENSOR_NAMES)",
  );
  for (const t of [
    KREA2_DIT_NAMES,
    QWEN_IMAGE_21_TRANSFORMER_NAMES,
    QWEN3VL_TEXT_NAMES,
    WAN21_VAE_NAMES,
    QWEN_IMAGE_21_VAE_NAMES,
    ...Object.values(GGUF_HF_NAMES),
  ]) {
    const shown = namesSource(t.source);
    expect(shown).not.toContain("shared/");
    expect(shown).not.toContain("§");
    expect(shown.length).toBeGreaterThan(10);
  }
});
