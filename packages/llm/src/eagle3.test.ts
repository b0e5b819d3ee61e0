// EAGLE-3 speculative decoding (issue 27; models/eagle3.ts, speculative.ts Eagle3Drafter) with
// random-weight heads written by testing/eagle3.ts for the shared tiny targets:
// (a) the head's forward (a grounded prompt, then a rollout of 3 on its own outputs) against a float64
//     reference written here from llm.md §7.4, and stepCollect's taps against the cache-free forward
//     (cpu and Vulkan);
// (b) greedy output with --spec-type eagle3 byte-identical to vanilla greedy over 128 tokens on every
//     architecture of the shared files (cpu; qwen3 and llama on Vulkan), with a random head and with a
//     head that copies the target's last choice (so that drafts get accepted, several per step where
//     the target repeats itself), and through a target that rolls back only to snapshots;
// (c) bad head files: TpError naming the file and the tensor.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createBackend } from "@tp/backend-cpu";
import { openGguf } from "@tp/formats";
import { type Backend, type Tensor, TpError } from "@tp/tensor";
import { GenerationSession } from "./generate.ts";
import { KvCache } from "./kv-cache.ts";
import { loadModel } from "./load.ts";
import type { CausalLM } from "./model.ts";
import { eagle3Taps, loadEagle3Head, targetEmbedding } from "./models/eagle3.ts";
import { Eagle3Drafter } from "./speculative.ts";
import {
  type HeadTensors,
  type TinyEagle3,
  tinyEagle3,
  writeTinyEagle3,
  writeTinyEagle3Gguf,
} from "./testing/eagle3.ts";
import { SnapshotRollback } from "./testing/snapshot-rollback.ts";
import { matvec, maxAbsDiff, rmsNorm, ropeNeox } from "./testing/tiny-models.ts";
import { startVulkan } from "./testing/vulkan.ts";

const MODELS = resolve(import.meta.dir, "../../../../shared/models");
const HAVE_MODELS = existsSync(join(MODELS, "PROVENANCE.md"));
const SKIP = HAVE_MODELS ? "" : `skipped: ${MODELS} is absent`;
const backend = createBackend({ threads: 2 });
const vk = HAVE_MODELS ? startVulkan() : {};
const VK_SKIP = vk.backend === undefined ? `skipped: no Vulkan device starts (${vk.reason})` : "";
const tmp = mkdtempSync(join(tmpdir(), "tp-eagle3-"));
afterAll(() => {
  rmSync(tmp, { recursive: true, force: true });
  backend.dispose();
  vk.backend?.dispose();
});
/** The backends: the cpu on every target, Vulkan (Mesa llvmpipe here: slow) on two architectures. */
const BACKENDS: [string, Backend | undefined, string, (name: string) => boolean][] = [
  ["cpu", backend, SKIP, () => true],
  ["vulkan", vk.backend, SKIP || VK_SKIP, (n) => ["qwen3", "llama"].includes(n)],
];

/**
 * f32 head vs the f64 reference, relative to max |reference| of the compared rows: one decoder layer
 * of width ≤ 128 after fc over 3·64 inputs, f32 sums (measured ≤ 3e-7 of the logits' scale).
 */
const HEAD_REL_TOL = 1e-5;
/** stepCollect vs forward({ collect }): the same f32 ops, the attention reading the cache instead. */
const SAME_OPS_TOL = 1e-5;

/** f32 values of a GGUF tensor (F32 files only), copied. */
function ggufF32(path: string, name: string): Float32Array {
  const g = openGguf(path);
  try {
    const bytes = g.data(name);
    return new Float32Array(bytes.slice().buffer);
  } finally {
    g.close();
  }
}

/**
 * The EAGLE-3 head in float64, from llm.md §7.4 (not from models/eagle3.ts): per pair (feat, token)
 * at RoPE position p, x = [RMSNorm(embed(token)); RMSNorm(feat)], causal GQA attention over the pairs
 * so far (its own keys and values), residual = feat, SwiGLU, norm, draft lm_head.
 */
class ReferenceHead {
  readonly keys: Float64Array[][] = [];
  readonly values: Float64Array[][] = [];
  constructor(
    readonly w: HeadTensors,
    readonly c: { heads: number; kvHeads: number; headDim: number; eps: number; theta: number },
  ) {}
  get(n: string) {
    const t = this.w.get(n);
    if (t === undefined) throw new Error(`reference head: no ${n}`);
    return t;
  }
  /** fc([h_a ; h_b ; h_c]). */
  fuse(taps: Float64Array[]): Float64Array {
    const x = new Float64Array(taps.reduce((a, t) => a + t.length, 0));
    let at = 0;
    for (const t of taps) {
      x.set(t, at);
      at += t.length;
    }
    return matvec(this.get("fc.weight"), x);
  }
  step(feat: Float64Array, embed: Float64Array, pos: number): { out: Float64Array; logits: Float64Array } {
    const { heads: nh, kvHeads: kvh, headDim: hd, eps, theta } = this.c;
    const H = feat.length;
    const x = new Float64Array(2 * H);
    x.set(rmsNorm(embed, this.get("midlayer.input_layernorm.weight").values, eps), 0);
    x.set(rmsNorm(feat, this.get("midlayer.hidden_norm.weight").values, eps), H);
    const split = (v: Float64Array, n: number) =>
      Array.from({ length: n }, (_, h) => v.slice(h * hd, (h + 1) * hd));
    const q = split(matvec(this.get("midlayer.self_attn.q_proj.weight"), x), nh).map((v) =>
      ropeNeox(v, pos, theta),
    );
    this.keys.push(
      split(matvec(this.get("midlayer.self_attn.k_proj.weight"), x), kvh).map((v) => ropeNeox(v, pos, theta)),
    );
    this.values.push(split(matvec(this.get("midlayer.self_attn.v_proj.weight"), x), kvh));
    const o = new Float64Array(nh * hd);
    for (let h = 0; h < nh; h++) {
      const g = Math.floor(h / (nh / kvh));
      const s = this.keys.map((k) => {
        let d = 0;
        for (let i = 0; i < hd; i++) d += (q[h]?.[i] as number) * (k[g]?.[i] as number);
        return d / Math.sqrt(hd);
      });
      const m = Math.max(...s);
      const e = s.map((v) => Math.exp(v - m));
      const z = e.reduce((a, b) => a + b, 0);
      this.values.forEach((v, j) => {
        for (let i = 0; i < hd; i++)
          o[h * hd + i] = (o[h * hd + i] as number) + ((e[j] as number) / z) * (v[g]?.[i] as number);
      });
    }
    const attn = matvec(this.get("midlayer.self_attn.o_proj.weight"), o);
    const r = Float64Array.from(feat, (v, i) => v + (attn[i] as number));
    const f = rmsNorm(r, this.get("midlayer.post_attention_layernorm.weight").values, eps);
    const gate = matvec(this.get("midlayer.mlp.gate_proj.weight"), f);
    const up = matvec(this.get("midlayer.mlp.up_proj.weight"), f);
    const act = Float64Array.from(gate, (gv, i) => (gv / (1 + Math.exp(-gv))) * (up[i] as number));
    const down = matvec(this.get("midlayer.mlp.down_proj.weight"), act);
    const out = Float64Array.from(r, (v, i) => v + (down[i] as number));
    const logits = matvec(this.get("lm_head.weight"), rmsNorm(out, this.get("norm.weight").values, eps));
    return { out, logits };
  }
}

function argmax64(x: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < x.length; i++) if ((x[i] as number) > (x[best] as number)) best = i;
  return best;
}

async function readFree(t: Tensor): Promise<Float32Array> {
  const v = (await t.backend.read(t)) as Float32Array;
  t.backend.free(t);
  return v;
}

/** The shared targets: F32 GGUFs of every architecture (the reference reads their f32 embeddings). */
const TARGETS: { name: string; file: string; head?: string }[] = [
  { name: "qwen3", file: "synthetic/qwen3-tiny-F32.gguf" },
  { name: "llama", file: "synthetic/llama-tiny-F32.gguf", head: "output.weight" },
  { name: "stories260K (llama, trained)", file: "real/stories260K-f32-v3.gguf", head: "output.weight" },
  { name: "qwen3moe", file: "synthetic/qwen3moe-tiny-F32.gguf", head: "output.weight" },
  { name: "gemma3", file: "synthetic/gemma3-tiny-F32.gguf" },
  { name: "qwen35", file: "synthetic/qwen35-tiny-F32.gguf" },
  { name: "qwen35moe", file: "synthetic/qwen35moe-tiny-F32.gguf" },
];

/** Write a head for `model` (random, or copying the target's choice) and load it. */
function headFor(
  model: CausalLM,
  be: Backend,
  path: string,
  name: string,
  opts: { mimic?: boolean; headTensor?: string; seed?: number; include?: readonly number[] } = {},
) {
  const c = model.config;
  const mimic =
    opts.mimic === true
      ? {
          // fc passes the first tap through: hidden_states[N] when the target has < 6 layers, else N − 2
          tap: 0,
          norm: ggufF32(path, "output_norm.weight"),
          head: ggufF32(path, opts.headTensor ?? "token_embd.weight"),
        }
      : undefined;
  const h = tinyEagle3(c, {
    seed: opts.seed ?? 5,
    ...(mimic === undefined ? {} : { mimic }),
    ...(opts.include === undefined ? {} : { include: opts.include }),
  });
  const file = join(tmp, `${name}${opts.mimic ? "-mimic" : ""}.safetensors`);
  writeTinyEagle3(file, h);
  const emb = targetEmbedding(model);
  const head = loadEagle3Head(file, be, c, emb === undefined ? {} : { targetEmbedding: emb });
  return { h, head, file };
}

for (const [label, be0, skip] of BACKENDS)
  describe.skipIf(be0 === undefined || !HAVE_MODELS)(
    `EAGLE-3 head forward vs a float64 reference, ${label} ${skip}`,
    () => {
      const backend = be0 as Backend;
      for (const a of TARGETS.slice(0, 2)) {
        test(`${a.name}: grounded prompt rows and a rollout of 3, within ${HEAD_REL_TOL} of max |ref|`, async () => {
          const path = join(MODELS, a.file);
          const t = loadModel(path, { backend, maxContext: 256 });
          const { h, head } = headFor(t.model, backend, path, `ref-${a.name}-${label}`);
          try {
            const c = t.model.config;
            const taps = eagle3Taps(c.num_hidden_layers);
            expect(taps).toEqual([2, 2, 1]); // 2 layers: outputs of layers 1, 1, 0 (clamped)
            const unique = [...new Set(taps)];
            const ids = t.tokenizer.encode("Once upon a time, there was", { addSpecial: true });
            const n = ids.length;
            // the taps from the cached forward equal those of the cache-free forward
            const free = await Promise.all(t.model.forward(ids, { collect: unique }).map(readFree));
            t.model.truncate(0);
            const stepped = t.model.stepCollect?.(ids, unique) as { logits: Tensor; hidden: Tensor[] };
            backend.free(stepped.logits);
            const cached = await Promise.all(stepped.hidden.map(readFree));
            for (let i = 0; i < unique.length; i++)
              expect(maxAbsDiff(cached[i] as Float32Array, free[i] as Float32Array)).toBeLessThan(
                SAME_OPS_TOL,
              );
            expect(t.model.cached).toBe(n);
            t.model.truncate(0);

            // reference: fc over the taps (read from the engine), the head in float64
            const H = c.hidden_size;
            const row = (x: Float32Array, p: number) => Float64Array.from(x.subarray(p * H, (p + 1) * H));
            const emb = ggufF32(path, "token_embd.weight");
            const embed = (id: number) => Float64Array.from(emb.subarray(id * H, (id + 1) * H));
            const ref = new ReferenceHead(h.tensors, {
              heads: head.config.num_attention_heads,
              kvHeads: head.config.num_key_value_heads,
              headDim: head.config.head_dim,
              eps: head.config.rms_norm_eps,
              theta: head.config.rope_theta,
            });
            const feats = Array.from({ length: n }, (_, p) =>
              ref.fuse(taps.map((l) => row(free[unique.indexOf(l)] as Float32Array, p))),
            );
            const refOut: Float64Array[] = [];
            const refLogits: Float64Array[] = [];
            for (let p = 0; p + 1 < n; p++) {
              const s = ref.step(feats[p] as Float64Array, embed(ids[p + 1] as number), p + 1);
              refOut.push(s.out);
              refLogits.push(s.logits);
            }
            const refDrafts = [argmax64(refLogits[n - 2] as Float64Array)];
            let g = refOut[n - 2] as Float64Array;
            for (let s = 1; s <= 3; s++) {
              const tid = h.draftToTarget[refDrafts[s - 1] as number] as number;
              const r = ref.step(g, embed(tid), n - 1 + s);
              refLogits.push(r.logits);
              g = r.out;
              refDrafts.push(argmax64(r.logits));
            }

            // engine: the same pairs through Eagle3Head.forward on its own cache
            const cache = new KvCache(backend, {
              layers: 1,
              numKvHeads: head.config.num_key_value_heads,
              headDim: head.config.head_dim,
              maxContext: 64,
            });
            try {
              const got: Float32Array[] = [];
              const drafts: number[] = [];
              const tapT = free.map((f, i) => backend.upload(f, [n, H], "f32", `tap${i}`));
              let feat = backend.scope(() => head.fuse(taps.map((l) => tapT[unique.indexOf(l)] as Tensor)));
              let fedIds = backend.upload(Int32Array.from(ids.slice(1)), [n - 1], "i32", "ids");
              let fedEmbed = head.embed(fedIds);
              let pos = backend.upload(
                Int32Array.from({ length: n - 1 }, (_, i) => i + 1),
                [n - 1],
                "i32",
                "pos",
              );
              let rows = n - 1;
              let input = feat.slice(0, 0, n - 1);
              for (let s = 0; s <= 3; s++) {
                cache.reserve(cache.length + rows);
                const { out, logits } = head.forward(fedEmbed, input, pos, cache);
                cache.commit(rows);
                const l = await backend.read(logits);
                const Vd = head.config.draft_vocab_size;
                for (let r = 0; r < rows; r++) got.push((l as Float32Array).slice(r * Vd, (r + 1) * Vd));
                const last = got[got.length - 1] as Float32Array;
                drafts.push(argmax64(last));
                for (const x of [fedEmbed, pos, feat, fedIds]) backend.free(x);
                backend.free(logits);
                feat = out;
                input = out.slice(0, rows - 1, rows);
                fedIds = backend.upload(Int32Array.of(drafts[s] as number), [1], "i32", "draft");
                fedEmbed = head.embedDraft(fedIds);
                pos = backend.upload(Int32Array.of(n + s), [1], "i32", "pos");
                rows = 1;
              }
              for (const x of [fedEmbed, pos, feat, fedIds, ...tapT]) backend.free(x);
              expect(got.length).toBe(refLogits.length);
              const scale = Math.max(...refLogits.map((r) => Math.max(...Array.from(r, Math.abs))));
              const worst = Math.max(...got.map((r, i) => maxAbsDiff(r, refLogits[i] as Float64Array)));
              if (process.env.SPEC_VERBOSE)
                console.log(a.name, "head", worst / scale, scale, drafts, refDrafts);
              expect(worst / scale).toBeLessThan(HEAD_REL_TOL);
              expect(drafts).toEqual(refDrafts);
              // the mapping is the d2t deltas: target = draft + d2t[draft]
              for (let i = 0; i < h.d2t.length; i++)
                expect(head.draftToTarget[i]).toBe(i + Number(h.d2t[i] as bigint));
            } finally {
              cache.dispose();
            }
          } finally {
            head.dispose();
            t.model.dispose();
          }
        });
      }
    },
  );

const N = 128;
const PROMPT = "Once upon a time, there was a little girl. Once upon a time";

for (const [label, be0, skip, runs] of BACKENDS)
  describe.skipIf(be0 === undefined || !HAVE_MODELS)(
    `greedy --spec-type eagle3 = vanilla, ${label} ${skip}`,
    () => {
      const backend = be0 as Backend;
      for (const a of TARGETS.filter((x) => runs(x.name))) {
        test(`${a.name}: random and target-copying heads, ${N} tokens, byte-identical`, async () => {
          const path = join(MODELS, a.file);
          const t = loadModel(path, {
            backend,
            maxContext: 512,
            ...(a.name === "gemma3" ? { kvRingBatch: 9 } : {}),
          });
          const prompt = t.tokenizer.encode(PROMPT, { addSpecial: true });
          const opts = { maxNewTokens: N, stopIds: [] as number[] };
          const vanilla = await new GenerationSession(t.model, t.tokenizer, { seed: 1 }).generate(
            prompt,
            opts,
          );
          expect(vanilla.ids.length).toBe(N);
          const heads = [
            headFor(t.model, backend, path, `lossless-${a.name}-${label}`),
            // its draft vocabulary holds the tokens of the answer (else copying them could not be proposed)
            headFor(t.model, backend, path, `lossless-${a.name}-${label}`, {
              mimic: true,
              include: vanilla.ids,
              ...(a.head ? { headTensor: a.head } : {}),
            }),
          ];
          try {
            const accepted: number[] = [];
            for (const { head } of heads) {
              for (const adaptive of [true, false]) {
                const drafter = new Eagle3Drafter(head, t.model);
                try {
                  const s = new GenerationSession(t.model, t.tokenizer, { seed: 1 });
                  const r = await s.generate(prompt, {
                    ...opts,
                    speculative: { drafter, adaptive, draftMax: 4 },
                  });
                  expect(r.ids).toEqual(vanilla.ids);
                  expect(r.text).toBe(vanilla.text);
                  const st = r.speculative;
                  if (st === undefined) throw new Error("no stats");
                  if (process.env.SPEC_VERBOSE)
                    console.log(a.name, head.file, adaptive, st, drafter.lastError);
                  expect(drafter.lastError).toBeUndefined();
                  expect(st.drafter).toBe("eagle3");
                  expect(st.accepted + st.verifySteps).toBeGreaterThanOrEqual(N - 1);
                  expect(st.accepted + st.verifySteps).toBeLessThanOrEqual(N);
                  if (!adaptive) expect(st.drafted).toBeGreaterThan(N / 2); // it did draft on most rounds
                  expect(s.cachedIds).toEqual([...prompt, ...r.ids].slice(0, t.model.cached));
                  accepted.push(st.accepted);
                } finally {
                  drafter.dispose();
                }
              }
            }
            // the copying head proposes the target's own last choice: accepted wherever the target repeats
            let repeats = 0;
            for (let i = 1; i < N; i++) if (vanilla.ids[i] === vanilla.ids[i - 1]) repeats++;
            if (process.env.SPEC_VERBOSE) console.log(a.name, "repeats", repeats, "accepted", accepted);
            // (only where fc can pass the target's last hidden state through: a tap is hidden_states[N])
            const L = t.model.config.num_hidden_layers;
            if (repeats >= 8 && eagle3Taps(L)[0] === L)
              expect(accepted[3] as number).toBeGreaterThan(repeats / 4);
          } finally {
            for (const { head } of heads) head.dispose();
            t.model.dispose();
          }
        }, 300_000);
      }
    },
  );

describe.skipIf(vk.backend === undefined || !HAVE_MODELS)(
  `greedy --spec-type eagle3 on a target placed over cpu + Vulkan = vanilla ${SKIP || VK_SKIP}`,
  () => {
    // -ngl 0 / 1 / 2: the taps are made on the host (the blocks' backend) while the head runs on the
    // device, or on both; fuse moves them (this was an E_STATE from concat before)
    for (const [name, file] of [
      ["qwen3", "synthetic/qwen3-tiny-F32.gguf"],
      ["gemma3", "synthetic/gemma3-tiny-F32.gguf"],
    ] as const)
      test(`${name}: -ngl 0, 1, 2 with a target-copying head on Vulkan, 24 tokens, byte-identical`, async () => {
        const dev = vk.backend as Backend;
        const path = join(MODELS, file);
        const ref = loadModel(path, { backend, maxContext: 128 });
        const prompt = ref.tokenizer.encode(PROMPT, { addSpecial: true });
        const opts = { maxNewTokens: 24, stopIds: [] as number[] };
        const vanilla = await new GenerationSession(ref.model, ref.tokenizer, { seed: 1 }).generate(
          prompt,
          opts,
        );
        ref.model.dispose();
        for (const gpuLayers of [0, 1, 2]) {
          const t = loadModel(path, {
            backend: dev,
            maxContext: 128,
            placement: { host: backend, gpuLayers },
          });
          const { head } = headFor(t.model, dev, path, `placed-${name}-${gpuLayers}`, {
            mimic: true,
            include: vanilla.ids,
          });
          const drafter = new Eagle3Drafter(head, t.model);
          try {
            const r = await new GenerationSession(t.model, t.tokenizer, { seed: 1 }).generate(prompt, {
              ...opts,
              speculative: { drafter, adaptive: false, draftMax: 4 },
            });
            expect(drafter.lastError).toBeUndefined();
            expect(r.ids).toEqual(vanilla.ids);
            expect(r.speculative?.drafted ?? 0).toBeGreaterThan(0);
          } finally {
            drafter.dispose();
            head.dispose();
            t.model.dispose();
          }
        }
      }, 120_000);
  },
);

describe.skipIf(!HAVE_MODELS)(`EAGLE-3 with snapshot rollback ${SKIP}`, () => {
  test("a target that rolls back only to snapshots (as Qwen 3.5's recurrent state): accepted drafts replayed untapped, output still vanilla's", async () => {
    const path = join(MODELS, "synthetic/qwen3-tiny-F32.gguf");
    const t = loadModel(path, { backend, maxContext: 512 });
    const prompt = t.tokenizer.encode(PROMPT, { addSpecial: true });
    const opts = { maxNewTokens: N, stopIds: [] as number[] };
    const vanilla = await new GenerationSession(t.model, t.tokenizer, { seed: 1 }).generate(prompt, opts);
    const { head } = headFor(t.model, backend, path, "snapshot-qwen3", { mimic: true, include: vanilla.ids });
    const wrapped = new SnapshotRollback(t.model);
    const drafter = new Eagle3Drafter(head, wrapped);
    try {
      const s = new GenerationSession(wrapped, t.tokenizer, { seed: 1 });
      const r = await s.generate(prompt, { ...opts, speculative: { drafter, draftMax: 4, adaptive: false } });
      expect(r.ids).toEqual(vanilla.ids);
      expect(wrapped.restores).toBeGreaterThan(5); // rejections went back past accepted drafts
      expect(r.speculative?.accepted ?? 0).toBeGreaterThan(20);
      expect(drafter.lastError).toBeUndefined();
    } finally {
      drafter.dispose();
      head.dispose();
      t.model.dispose();
    }
  }, 120_000);
});

describe.skipIf(!HAVE_MODELS)(`stepCollect ${SKIP}`, () => {
  test("gemma3 with a ring of 8 + 9 rows: a prompt split into forwards, taps joined, equal to the cache-free forward", async () => {
    const t = loadModel(join(MODELS, "synthetic/gemma3-tiny-F32.gguf"), {
      backend,
      maxContext: 128,
      kvRingBatch: 9,
    });
    try {
      const ids = t.tokenizer.encode(`${PROMPT} and a dog`, { addSpecial: true });
      expect(ids.length).toBeGreaterThan(18); // three forwards of at most 9 rows
      const L = t.model.config.num_hidden_layers;
      const collect = [L, 1, 3];
      const free = await Promise.all(t.model.forward(ids, { collect }).map(readFree));
      const r = t.model.stepCollect?.(ids, collect, { allLogits: true }) as {
        logits: Tensor;
        hidden: Tensor[];
      };
      const logits = await readFree(r.logits);
      expect(logits.length).toBe(ids.length * t.model.config.vocab_size);
      const got = await Promise.all(r.hidden.map(readFree));
      for (let i = 0; i < collect.length; i++) {
        expect(got[i]?.length).toBe(ids.length * t.model.config.hidden_size);
        const ref = free[i] as Float32Array;
        const scale = Math.max(...Array.from(ref, Math.abs));
        // gemma's √H-scaled residual stream is large: the same f32 ops, compared relative to its size
        expect(maxAbsDiff(got[i] as Float32Array, ref) / scale).toBeLessThan(SAME_OPS_TOL);
      }
      expect(t.model.cached).toBe(ids.length);
      expect(() => t.model.stepCollect?.([1], [L + 1])).toThrow(/distinct integer in \[0, 6\]/);
      expect(() => t.model.stepCollect?.([1], [2, 2])).toThrow(TpError);
      expect(t.model.cached).toBe(ids.length); // nothing written by a refused call
    } finally {
      t.model.dispose();
    }
  });
});

describe.skipIf(!HAVE_MODELS)(`EAGLE-3 head containers and config ${SKIP}`, () => {
  test("a GGUF head with the same names gives the safetensors head's logits exactly; config.json beside it sets heads and taps", async () => {
    const path = join(MODELS, "synthetic/qwen3-tiny-F32.gguf");
    const t = loadModel(path, { backend, maxContext: 64 });
    const c = t.model.config;
    const emb = {
      targetEmbedding: targetEmbedding(t.model) as NonNullable<ReturnType<typeof targetEmbedding>>,
    };
    const h = tinyEagle3(c, { seed: 9, headDim: 16, numAttentionHeads: 4, numKeyValueHeads: 2 });
    const dir = mkdtempSync(join(tmp, "cfg-"));
    const st = join(dir, "model.safetensors");
    const gg = join(tmp, "head.gguf");
    writeTinyEagle3(st, h);
    writeTinyEagle3Gguf(gg, h);
    // no config.json beside the GGUF: head_dim is the target's (32), so 64 query rows are 2 heads
    const a = loadEagle3Head(gg, backend, c, emb);
    // config.json beside the safetensors: head_dim 16, 4 heads
    writeFileSync(
      join(dir, "config.json"),
      JSON.stringify({
        architectures: ["LlamaForCausalLMEagle3"],
        head_dim: 16,
        draft_vocab_size: h.d2t.length,
      }),
    );
    const b = loadEagle3Head(st, backend, c, emb);
    try {
      expect([a.config.num_attention_heads, a.config.num_key_value_heads, a.config.head_dim]).toEqual([
        2, 1, 32,
      ]);
      expect([b.config.num_attention_heads, b.config.num_key_value_heads, b.config.head_dim]).toEqual([
        4, 2, 16,
      ]);
      expect(b.config).toMatchObject({
        hidden_size: 64,
        intermediate_size: 128,
        draft_vocab_size: 2061,
        vocab_size: 4122,
      });
      expect(Array.from(a.draftToTarget)).toEqual(Array.from(h.draftToTarget));
      expect(b.config.taps).toBeUndefined();
      // heads from num_attention_heads win over a head_dim the shapes contradict; aux layer ids → taps
      writeFileSync(
        join(dir, "config.json"),
        JSON.stringify({
          draft_vocab_size: h.d2t.length,
          num_attention_heads: 4,
          head_dim: 12,
          eagle_config: { eagle_aux_hidden_state_layer_ids: [0, 1, 0] },
        }),
      );
      const b2 = loadEagle3Head(st, backend, c, emb);
      try {
        expect([b2.config.num_attention_heads, b2.config.head_dim]).toEqual([4, 16]);
        expect(b2.config.taps).toEqual([1, 2, 1]);
        const d = new Eagle3Drafter(b2, t.model);
        expect(d.taps).toEqual([1, 2]);
        d.dispose();
      } finally {
        b2.dispose();
      }
      writeFileSync(
        join(dir, "config.json"),
        JSON.stringify({ draft_vocab_size: 1, eagle_config: { eagle_aux_hidden_state_layer_ids: [1] } }),
      );
      expect(() => loadEagle3Head(st, backend, c, emb)).toThrow(
        /eagle_aux_hidden_state_layer_ids must be three/,
      );
      // the same weights under both containers: the same logits when both read head_dim 16
      writeFileSync(
        join(tmp, "config.json"),
        JSON.stringify({ draft_vocab_size: h.d2t.length, head_dim: 16 }),
      );
      const a16 = loadEagle3Head(gg, backend, c, emb);
      try {
        const run = async (head: typeof a) => {
          const cache = new KvCache(backend, {
            layers: 1,
            numKvHeads: head.config.num_key_value_heads,
            headDim: head.config.head_dim,
            maxContext: 8,
          });
          try {
            return await backend.scope(() => {
              const ids = backend.upload(Int32Array.of(5, 9, 200), [3], "i32", "ids");
              const feat = backend.upload(
                Float32Array.from({ length: 3 * 64 }, (_, i) => Math.sin(i)),
                [3, 64],
                "f32",
                "feat",
              );
              const pos = backend.upload(Int32Array.of(1, 2, 3), [3], "i32", "pos");
              cache.reserve(3);
              const { logits } = head.forward(head.embed(ids), feat, pos, cache);
              cache.commit(3);
              return backend.persist(logits);
            });
          } finally {
            cache.dispose();
          }
        };
        const x = await readFree(await run(a16));
        const y = await readFree(await run(b));
        expect(maxAbsDiff(x, y)).toBe(0);
      } finally {
        a16.dispose();
      }
    } finally {
      a.dispose();
      b.dispose();
      rmSync(join(tmp, "config.json"), { force: true });
      t.model.dispose();
    }
  });
});

describe.skipIf(!HAVE_MODELS)(`bad EAGLE-3 head files ${SKIP}`, () => {
  test("missing or misshaped tensors, a bad d2t, not a checkpoint: TpError naming file and tensor", () => {
    const path = join(MODELS, "synthetic/qwen3-tiny-F32.gguf");
    const t = loadModel(path, { backend, maxContext: 64 });
    try {
      const c = t.model.config;
      const emb = targetEmbedding(t.model);
      const good: TinyEagle3 = tinyEagle3(c, { seed: 3 });
      const cases: [string, (f: string) => void, string, RegExp][] = [
        ["no-fc", (f) => writeTinyEagle3(f, good, { drop: ["fc.weight"] }), "fc.weight", /missing tensor/],
        [
          "fc-2h",
          (f) => writeTinyEagle3(f, good, { reshape: { "fc.weight": [64, 128] } }),
          "fc.weight",
          /three taps/,
        ],
        [
          "q-narrow",
          (f) => writeTinyEagle3(f, good, { reshape: { "midlayer.self_attn.q_proj.weight": [64, 64] } }),
          "midlayer.self_attn.q_proj.weight",
          /2·64 = 128 wide/,
        ],
        [
          "no-norm",
          (f) => writeTinyEagle3(f, good, { drop: ["midlayer.hidden_norm.weight"] }),
          "midlayer.hidden_norm.weight",
          /missing tensor/,
        ],
        [
          "o-proj",
          (f) => writeTinyEagle3(f, good, { reshape: { "midlayer.self_attn.o_proj.weight": [64, 32] } }),
          "midlayer.self_attn.o_proj.weight",
          /differs from \[64, 128\]/,
        ],
        ["no-d2t", (f) => writeTinyEagle3(f, good, { drop: ["d2t"] }), "d2t", /missing tensor/],
        ["d2t-short", (f) => writeTinyEagle3(f, good, { reshape: { d2t: [10] } }), "d2t", /must be \[2061\]/],
        [
          "d2t-range",
          (f) => writeTinyEagle3(f, { ...good, d2t: good.d2t.map((x, i) => (i === 7 ? 100000n : x)) }),
          "d2t",
          /d2t\[7\] = 100000 maps draft id 7 to 100007, outside the target's vocabulary \[0, 4122\)/,
        ],
      ];
      for (const [name, write, tensor, message] of cases) {
        const f = join(tmp, `bad-${name}.safetensors`);
        write(f);
        let err: unknown;
        try {
          loadEagle3Head(f, backend, c, emb === undefined ? {} : { targetEmbedding: emb }).dispose();
        } catch (e) {
          err = e;
        }
        expect(err).toBeInstanceOf(TpError);
        expect((err as TpError).code).toBe("E_FORMAT");
        expect((err as TpError).file).toBe(f);
        expect((err as TpError).tensor).toBe(tensor);
        expect((err as TpError).message).toMatch(message);
      }
      const junk = join(tmp, "junk.safetensors");
      writeFileSync(junk, "not a checkpoint at all");
      expect(() => loadEagle3Head(junk, backend, c)).toThrow(TpError);
      // no embedding in the head and none given
      const noEmb = join(tmp, "no-embedding.safetensors");
      writeTinyEagle3(noEmb, good);
      expect(() => loadEagle3Head(noEmb, backend, c)).toThrow(/no embed_tokens.weight/);
      // a head for another target width
      const llama = loadModel(join(MODELS, "synthetic/llama-tiny-F32.gguf"), { backend, maxContext: 64 });
      try {
        const le = targetEmbedding(llama.model);
        expect(() =>
          loadEagle3Head(noEmb, backend, llama.model.config, le === undefined ? {} : { targetEmbedding: le }),
        ).toThrow(/outside the target's vocabulary \[0, 512\)/);
      } finally {
        llama.model.dispose();
      }
    } finally {
      t.model.dispose();
    }
  });
});
