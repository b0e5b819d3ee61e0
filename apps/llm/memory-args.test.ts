// The memory flags of bun apps/llm (memory-args.ts): llama.cpp's spellings, every bad value one E_ARG
// naming the flag; then, where a Vulkan device starts, a placed run prints its placement and the
// same greedy ids as the cpu backend, and a budget below what -ngl asks is one E_OOM line at load.
import { describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createBackend as createVulkan } from "@tp/backend-vulkan";
import { tinyEagle3, writeTinyEagle3 } from "@tp/llm/testing";
import { TpError } from "@tp/tensor";
import { parseLlmArgs } from "./args.ts";

const MODELS = resolve(import.meta.dir, "../../../shared/models");
const MOE = join(MODELS, "synthetic/qwen3moe-tiny-F32.gguf");
const APP = resolve(import.meta.dir, "index.ts");

const parse = (...a: string[]) => parseLlmArgs(["-m", "x.gguf", ...a]).memory;

/** The E_ARG message of parsing `a`. */
function argError(...a: string[]): string {
  try {
    parse(...a);
  } catch (e) {
    expect(e).toBeInstanceOf(TpError);
    expect((e as TpError).code).toBe("E_ARG");
    return (e as TpError).message;
  }
  throw new Error(`no error for ${a.join(" ")}`);
}

describe("memory flags", () => {
  test("-ngl / --gpu-layers / --n-gpu-layers, all, the MoE flags, budgets with units", () => {
    expect(parse("--backend", "vulkan", "-ngl", "3").gpuLayers).toBe(3);
    expect(parse("--backend", "vulkan", "-ngl=all").gpuLayers).toBe("all");
    expect(parse("--backend", "vulkan", "--gpu-layers", "99").gpuLayers).toBe(99);
    expect(parse("--backend", "vulkan", "--n-gpu-layers", "auto").gpuLayers).toBe("all");
    const m = parse("--backend", "vulkan", "-ngl", "2", "--cpu-layers", "attn", "-ncmoe", "4");
    expect([m.cpuLayers, m.nCpuMoe, m.cpuMoe]).toEqual(["attn", 4, false]);
    expect(parse("--backend", "vulkan", "--cpu-moe").cpuMoe).toBe(true);
    expect(parse("--backend", "vulkan", "--vram-budget", "1.5GiB").vramBudget).toBe(1.5 * 2 ** 30);
    expect(parse("--backend", "vulkan", "--vram-budget", "min").vramBudget).toBe("min");
    expect(parse("--ram-budget", "512M").ramBudget).toBe(512 * 2 ** 20);
    expect(parse()).toEqual({
      gpuLayers: undefined,
      cpuLayers: undefined,
      cpuMoe: false,
      nCpuMoe: undefined,
      vramBudget: undefined,
      ramBudget: undefined,
    });
  });
  test("bad values and combinations: one E_ARG naming the flag", () => {
    expect(argError("--backend", "vulkan", "-ngl", "x")).toStartWith("-ngl must be a whole number");
    expect(argError("--backend", "vulkan", "-ngl", "-1")).toStartWith("-ngl must be a whole number");
    expect(argError("--backend", "vulkan", "-ngl", "1", "--n-gpu-layers", "2")).toContain("same flag");
    expect(argError("--backend", "vulkan", "-ngl", "1", "--cpu-layers", "head")).toStartWith(
      "--cpu-layers must be tail or attn",
    );
    expect(argError("--backend", "vulkan", "--n-cpu-moe", "1.5")).toStartWith("--n-cpu-moe must be");
    expect(argError("--backend", "vulkan", "--cpu-moe", "--n-cpu-moe", "2")).toContain("--cpu-moe");
    expect(argError("--backend", "vulkan", "--vram-budget", "lots")).toStartWith("--vram-budget takes");
    expect(argError("--ram-budget", "min")).toStartWith("--ram-budget takes");
    expect(argError("--ram-budget", "-3")).toStartWith("--ram-budget takes");
    expect(argError("-ngl", "2")).toStartWith("-ngl places layers on a device backend");
    expect(argError("--cpu-moe")).toStartWith("--cpu-moe places layers on a device backend");
    expect(argError("--backend", "vulkan", "--cpu-layers", "tail")).toStartWith(
      "--cpu-layers chooses which layers",
    );
  });
});

function vulkanStarts(): boolean {
  try {
    createVulkan().dispose();
    return true;
  } catch {
    return false;
  }
}
const SKIP = !existsSync(MOE)
  ? "the shared models are absent"
  : !vulkanStarts()
    ? "no Vulkan device starts"
    : "";

async function cli(args: string[], model = MOE) {
  const p = Bun.spawn(
    ["bun", APP, "-m", model, "--raw", "-p", "Once upon a time", "-n", "8", "--temp", "0", ...args],
    {
      stdout: "pipe",
      stderr: "pipe",
    },
  );
  const [stdout, stderr, code] = await Promise.all([
    new Response(p.stdout).text(),
    new Response(p.stderr).text(),
    p.exited,
  ]);
  return { stdout, stderr, code };
}

describe.skipIf(SKIP !== "")(
  `bun apps/llm placed on Vulkan + cpu${SKIP ? ` — skipped: ${SKIP}` : ""}`,
  () => {
    test("-ngl 2 --n-cpu-moe 1: the placement line, the cpu's text, and the memory figures", async () => {
      const ref = await cli(["--ctx", "64"]);
      const r = await cli(["--ctx", "64", "--backend", "vulkan", "-ngl", "2", "--n-cpu-moe", "1"]);
      expect(r.code).toBe(0);
      expect(r.stdout).toBe(ref.stdout);
      expect(r.stderr).toContain("[placement: layers 0 on cpu; layers 1 + head on vulkan]");
      expect(r.stderr).toMatch(/peak device \d+ MiB, peak cpu \d+ MiB, peak RSS \d+ MiB, mapped \d+ MiB/);
    }, 60_000);
    test("--vram-budget below what -ngl all needs: one E_OOM line naming the flag and the bytes", async () => {
      const r = await cli(["--ctx", "64", "--backend", "vulkan", "-ngl", "all", "--vram-budget", "64KiB"]);
      expect(r.code).not.toBe(0);
      expect(r.stderr.trim().split("\n")).toHaveLength(1);
      expect(r.stderr).toMatch(
        /^error E_OOM: --vram-budget 65536 bytes is below the \d+ bytes -ngl all needs/,
      );
    }, 60_000);
    test("a draft model or head that cannot run under --vram-budget: a notice, or at load an E_OOM naming the flag", async () => {
      const ref = await cli(["--ctx", "64"]);
      // the target fits nowhere on the device at 1 MiB (-ngl 0); the draft, loaded on the device, runs
      // out of it: its rounds propose nothing — said on stderr, not a silent "accepted 0/0 drafts"
      const r = await cli([
        "--ctx",
        "64",
        "--backend",
        "vulkan",
        "--vram-budget",
        "1MiB",
        "-md",
        MOE,
        "--draft-p-min",
        "0",
      ]);
      expect(r.code).toBe(0);
      expect(r.stdout).toBe(ref.stdout);
      expect(r.stderr).toMatch(
        /\nnotice: speculative draft: a drafting round failed and proposed nothing \(E_OOM: /,
      );
      expect(r.stderr).toContain("spec draft: accepted 0/0 drafts");
      // min: nothing on the device, so the draft's weights cannot even load: one E_OOM line naming -md
      const m = await cli(["--ctx", "64", "--backend", "vulkan", "--vram-budget", "min", "-md", MOE]);
      expect(m.code).toBe(1);
      expect(m.stderr).toMatch(
        /\nerror E_OOM: the draft model \(-md\) does not fit on vulkan: .* \(file [^\n]+\)\n$/,
      );
      // the same for an EAGLE-3 head (loaded on the device too)
      const head = join(mkdtempSync(join(tmpdir(), "tp-llm-mem-")), "head.safetensors");
      writeTinyEagle3(head, tinyEagle3({ hidden_size: 64, vocab_size: 4122, head_dim: 32 }));
      const dense = join(MODELS, "synthetic/qwen3-tiny-F32.gguf");
      const e = await cli(
        ["--ctx", "64", "--backend", "vulkan", "--vram-budget", "min", "--eagle", head],
        dense,
      );
      rmSync(dirname(head), { recursive: true, force: true });
      expect(e.code).toBe(1);
      expect(e.stderr).toMatch(
        /\nerror E_OOM: the EAGLE-3 head \(--eagle\) does not fit on vulkan: .* \(file [^\n]+head\.safetensors\)\n$/,
      );
    }, 60_000);
    test("--cpu-moe / --n-cpu-moe on a dense model: one E_ARG line (they would place nothing)", async () => {
      const dense = join(MODELS, "synthetic/qwen3-tiny-F32.gguf");
      for (const flags of [["--cpu-moe"], ["--n-cpu-moe", "1", "--vram-budget", "1GiB"]]) {
        const r = await cli(["--ctx", "64", "--backend", "vulkan", ...flags], dense);
        expect(r.code).toBe(2);
        expect(r.stdout).toBe("");
        expect(r.stderr).toBe(
          `error E_ARG: ${flags[0]} places expert stacks, and this model has none (a dense model); drop ${flags[0]}\n`,
        );
      }
    }, 60_000);
  },
);
