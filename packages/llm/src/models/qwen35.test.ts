// qwen35 against a float64 forward written from the equations (llm.md §3.4) on the shared tiny F32 file
// (../shared/models/synthetic/qwen35-tiny-F32.gguf: 6 Gated DeltaNet + 2 gated attention layers, value
// head j on key head j mod 2): the logits of every prompt row in one batched step (the chunked delta
// rule), and of a token-by-token run (the sequential form carrying conv and delta-rule state), and after
// a rollback to a snapshot. The reference reads the file's f32 tensors itself and shares no code with
// the model.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { resolve } from "node:path";
import { createBackend } from "@tp/backend-cpu";
import { openGguf } from "@tp/formats";
import { loadModel } from "../load.ts";

const FILE = resolve(import.meta.dir, "../../../../../shared/models/synthetic/qwen35-tiny-F32.gguf");
const SKIP = existsSync(FILE)
  ? ""
  : `skipped: ${FILE} is absent (the shared models folder is not beside this checkout)`;
/** Prompt ids (below the tiny vocabulary's 4122). */
const IDS = [1925, 346, 705, 263, 264, 882, 17, 4097, 3000, 12];

/** The float64 forward: logits [n][vocab] of `ids` at positions 0 … n − 1. */
function reference(ids: readonly number[]): Float64Array[] {
  const g = openGguf(FILE);
  const meta = g.metadata;
  const int = (k: string) => meta.getInt(`qwen35.${k}`) as number;
  const H = int("embedding_length");
  const L = int("block_count");
  const nh = int("attention.head_count");
  const kvh = int("attention.head_count_kv");
  const hd = int("attention.key_length");
  const R = int("rope.dimension_count");
  const theta = meta.getFloat("qwen35.rope.freq_base") as number;
  const eps = meta.getFloat("qwen35.attention.layer_norm_rms_epsilon") as number;
  const K = int("ssm.conv_kernel");
  const dk = int("ssm.state_size");
  const nk = int("ssm.group_count");
  const nv = int("ssm.time_step_rank");
  const dv = int("ssm.inner_size") / nv;
  const interval = int("full_attention_interval");
  const C = 2 * nk * dk + nv * dv;
  const T = (name: string): Float64Array => {
    const b = g.data(name); // every tensor of this file that the reference reads is F32
    return Float64Array.from(new Float32Array(b.buffer, b.byteOffset, b.byteLength / 4));
  };
  const embed = T("token_embd.weight");
  const V = embed.length / H;
  const mv = (w: Float64Array, x: Float64Array, rows: number): Float64Array => {
    const cols = x.length;
    const y = new Float64Array(rows);
    for (let r = 0; r < rows; r++) {
      let s = 0;
      for (let c = 0; c < cols; c++) s += (w[r * cols + c] as number) * (x[c] as number);
      y[r] = s;
    }
    return y;
  };
  const rms = (x: Float64Array, w: Float64Array | null, e: number): Float64Array => {
    let ss = 0;
    for (const v of x) ss += v * v;
    const inv = 1 / Math.sqrt(ss / x.length + e);
    return x.map((v, i) => v * inv * (w === null ? 1 : (w[i] as number)));
  };
  const sig = (z: number) => 1 / (1 + Math.exp(-z));
  const silu = (z: number) => z * sig(z);
  const softplus = (z: number) => (z > 20 ? z : Math.log1p(Math.exp(z)));
  const rope = (x: Float64Array, p: number) => {
    const y = x.slice();
    for (let i = 0; i < R / 2; i++) {
      const a = p * theta ** ((-2 * i) / R);
      const c = Math.cos(a);
      const s = Math.sin(a);
      y[i] = (x[i] as number) * c - (x[i + R / 2] as number) * s;
      y[i + R / 2] = (x[i + R / 2] as number) * c + (x[i] as number) * s;
    }
    return y;
  };
  // per layer: attention keys / values so far, or the conv history and the delta-rule states
  const keys: Float64Array[][][] = [];
  const values: Float64Array[][][] = [];
  const conv: Float64Array[][] = [];
  const S: Float64Array[][] = [];
  for (let l = 0; l < L; l++) {
    keys.push([]);
    values.push([]);
    conv.push(Array.from({ length: K - 1 }, () => new Float64Array(C)));
    S.push(Array.from({ length: nv }, () => new Float64Array(dk * dv)));
  }
  const out: Float64Array[] = [];
  ids.forEach((id, p) => {
    let x = embed.slice(id * H, (id + 1) * H);
    for (let l = 0; l < L; l++) {
      const b = `blk.${l}.`;
      const a = rms(x, T(`${b}attn_norm.weight`), eps);
      let o: Float64Array;
      if ((l + 1) % interval === 0) {
        const qg = mv(T(`${b}attn_q.weight`), a, 2 * nh * hd);
        const kall = mv(T(`${b}attn_k.weight`), a, kvh * hd);
        const vall = mv(T(`${b}attn_v.weight`), a, kvh * hd);
        const kn = T(`${b}attn_k_norm.weight`);
        keys[l]?.push(
          Array.from({ length: kvh }, (_, j) => rope(rms(kall.slice(j * hd, (j + 1) * hd), kn, eps), p)),
        );
        values[l]?.push(Array.from({ length: kvh }, (_, j) => vall.slice(j * hd, (j + 1) * hd)));
        const heads = new Float64Array(nh * hd);
        for (let h = 0; h < nh; h++) {
          const q = rope(rms(qg.slice(2 * h * hd, 2 * h * hd + hd), T(`${b}attn_q_norm.weight`), eps), p);
          const kv = Math.floor(h / (nh / kvh));
          const ks = (keys[l] as Float64Array[][]).map((r) => r[kv] as Float64Array);
          const sc = ks.map((k) => q.reduce((s, v, i) => s + v * (k[i] as number), 0) / Math.sqrt(hd));
          const m = Math.max(...sc);
          const e = sc.map((v) => Math.exp(v - m));
          const z = e.reduce((s, v) => s + v, 0);
          for (let i = 0; i < hd; i++) {
            let s = 0;
            e.forEach((w, t) => {
              s += (w / z) * ((values[l] as Float64Array[][])[t]?.[kv]?.[i] as number);
            });
            heads[h * hd + i] = s * sig(qg[2 * h * hd + hd + i] as number);
          }
        }
        o = mv(T(`${b}attn_output.weight`), heads, H);
      } else {
        const u = mv(T(`${b}attn_qkv.weight`), a, C);
        const w = T(`${b}ssm_conv1d.weight`);
        const hist = [...(conv[l] as Float64Array[]), u];
        conv[l] = hist.slice(1);
        const uc = new Float64Array(C);
        for (let c = 0; c < C; c++) {
          let s = 0;
          for (let j = 0; j < K; j++)
            s += (w[c * K + j] as number) * ((hist[j] as Float64Array)[c] as number);
          uc[c] = silu(s);
        }
        const z = mv(T(`${b}attn_gate.weight`), a, nv * dv);
        const beta = mv(T(`${b}ssm_beta.weight`), a, nv).map(sig);
        const alpha = mv(T(`${b}ssm_alpha.weight`), a, nv);
        const A = T(`${b}ssm_a`);
        const dt = T(`${b}ssm_dt.bias`);
        const gnorm = T(`${b}ssm_norm.weight`);
        const unit = (v: Float64Array) => {
          const n = Math.sqrt(v.reduce((s, t) => s + t * t, 0));
          return v.map((t) => t / n);
        };
        const heads = new Float64Array(nv * dv);
        for (let j = 0; j < nv; j++) {
          const i = j % nk; // GGUF's tiled value-head order
          const q = unit(uc.slice(i * dk, (i + 1) * dk)).map((t) => t / Math.sqrt(dk));
          const k = unit(uc.slice(nk * dk + i * dk, nk * dk + (i + 1) * dk));
          const v = uc.slice(2 * nk * dk + j * dv, 2 * nk * dk + (j + 1) * dv);
          const decay = Math.exp((A[j] as number) * softplus((alpha[j] as number) + (dt[j] as number)));
          const s = (S[l] as Float64Array[])[j] as Float64Array;
          for (let e = 0; e < s.length; e++) s[e] = (s[e] as number) * decay;
          const oj = new Float64Array(dv);
          for (let c = 0; c < dv; c++) {
            let m = 0;
            for (let r = 0; r < dk; r++) m += (s[r * dv + c] as number) * (k[r] as number);
            const delta = (beta[j] as number) * ((v[c] as number) - m);
            for (let r = 0; r < dk; r++) s[r * dv + c] = (s[r * dv + c] as number) + (k[r] as number) * delta;
            for (let r = 0; r < dk; r++)
              oj[c] = (oj[c] as number) + (s[r * dv + c] as number) * (q[r] as number);
          }
          const nj = rms(oj, gnorm, eps);
          for (let c = 0; c < dv; c++) heads[j * dv + c] = (nj[c] as number) * silu(z[j * dv + c] as number);
        }
        o = mv(T(`${b}ssm_out.weight`), heads, H);
      }
      x = x.map((v, i) => v + (o[i] as number));
      const m = rms(x, T(`${b}post_attention_norm.weight`), eps);
      const F = T(`${b}ffn_up.weight`).length / H;
      const gt = mv(T(`${b}ffn_gate.weight`), m, F);
      const up = mv(T(`${b}ffn_up.weight`), m, F);
      const f = mv(
        T(`${b}ffn_down.weight`),
        gt.map((v, i) => silu(v) * (up[i] as number)),
        H,
      );
      x = x.map((v, i) => v + (f[i] as number));
    }
    out.push(mv(embed, rms(x, T("output_norm.weight"), eps), V));
  });
  return out;
}

/** max |a − b| / max |b|. */
function relErr(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let d = 0;
  let m = 0;
  for (let i = 0; i < b.length; i++) {
    d = Math.max(d, Math.abs((a[i] as number) - (b[i] as number)));
    m = Math.max(m, Math.abs(b[i] as number));
  }
  return d / m;
}

/**
 * Relative logit error allowed: f32 weights and activations (≈ 6e-8 per rounding) through 8 layers of
 * 64-wide dot products and the recurrences; measured ≤ 4.1e-6.
 */
const TOL = 2e-5;

describe.skipIf(SKIP !== "")(`qwen35 vs a float64 forward${SKIP ? ` — ${SKIP}` : ""}`, () => {
  const backend = createBackend({ threads: 2 });
  afterAll(() => backend.dispose());
  const ref = SKIP === "" ? reference(IDS) : [];

  test("batched prompt (chunked delta rule): every row's logits", async () => {
    const { model, config } = loadModel(FILE, { backend, maxContext: 64 });
    try {
      const all = model.step(IDS, { allLogits: true });
      const rows = (await backend.read(all)) as Float32Array;
      backend.free(all);
      const V = config.vocab_size;
      IDS.forEach((_, r) => {
        expect(relErr(rows.subarray(r * V, (r + 1) * V), ref[r] as Float64Array)).toBeLessThan(TOL);
      });
    } finally {
      model.dispose();
    }
  });

  test("token by token (sequential form, state carried), and again after a rollback to a snapshot", async () => {
    const { model } = loadModel(FILE, { backend, maxContext: 64 });
    try {
      const last = async () => {
        const l = model.step(IDS.slice(-1));
        const v = (await backend.read(l)) as Float32Array;
        backend.free(l);
        return v;
      };
      for (const [t, id] of IDS.slice(0, -1).entries()) {
        const l = model.step([id]);
        const v = (await backend.read(l)) as Float32Array;
        backend.free(l);
        expect(relErr(v, ref[t] as Float64Array)).toBeLessThan(TOL);
        if (t === 3) model.snapshot(); // after 4 tokens
      }
      expect(relErr(await last(), ref[IDS.length - 1] as Float64Array)).toBeLessThan(TOL);
      model.truncate(IDS.length - 2); // no snapshot there: back to the one at 4
      expect(model.cached).toBe(4);
      backend.free(model.step(IDS.slice(4, -1)));
      expect(relErr(await last(), ref[IDS.length - 1] as Float64Array)).toBeLessThan(TOL);
      model.truncate(0);
      expect(model.cached).toBe(0);
    } finally {
      model.dispose();
    }
    expect(backend.memory.current).toBe(0);
  });
});
