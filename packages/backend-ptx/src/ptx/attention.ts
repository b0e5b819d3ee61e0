/**
 * Fused attention with online softmax: one block per (query row, head, batch), keys in tiles of
 * {@link ATTENTION_BLOCK}; each thread scores one key of the tile, the block keeps the running max m
 * and sum l, rescales its output accumulators by e^(m_old − m_new) and adds Σ_j p_j v_j. Only a tile of
 * probabilities lives in shared memory — never [seq, seq] scores. GQA (query head h reads KV head
 * h / (heads / kv_heads)), causal mask with a query offset, sliding window, a fully visible prefix and
 * tanh soft-capping are folded in or passed as parameters.
 *
 * Sources: Vaswani et al. 2017 eq. 1; online softmax, Milakov & Gimelshein 2018; FlashAttention, Dao
 * et al. 2022 (the tiling idea); GQA, Ainslie et al. 2023; soft-capping, Gemma 2 report.
 */
import { KernelBuilder, type KernelSource } from "./emit.ts";

/** Threads per block, and keys per tile. */
export const ATTENTION_BLOCK = 128;

/** What an attention kernel folds in. */
export interface AttentionSpec {
  readonly headDim: number;
  readonly headDimV: number;
  readonly causal: boolean;
  readonly softcap: boolean;
}

export function attentionKernelName(s: AttentionSpec): string {
  return `attention_f32_d${s.headDim}_dv${s.headDimV}${s.causal ? "_causal" : ""}${s.softcap ? "_softcap" : ""}`;
}

/**
 * Parameters: out, q, k, v (contiguous [batch, heads, S, D]), sq, skv, heads, kv_heads, q_offset,
 * window, full_prefix (s32), scale, softcap (f32). Grid (sq, heads, batch).
 */
export function attentionKernel(s: AttentionSpec): KernelSource {
  const T = ATTENTION_BLOCK;
  const D = s.headDim;
  const Dv = s.headDimV;
  const kb = new KernelBuilder(attentionKernelName(s));
  const [out, q, k, v] = kb.lds("u64", "out", "q", "k", "v");
  const [sq, skv, heads, kvHeads] = kb.lds("u32", "sq", "skv", "heads", "kv_heads");
  const [qOffset, window, fullPrefix] = kb.lds("s32", "q_offset", "window", "full_prefix");
  const [scale, softcap] = kb.lds("f32", "scale", "softcap");
  const qs = kb.shared("q", D * 4);
  const ps = kb.shared("p", T * 4);
  const [tid, i, h, b, kvh, grp, qrow, kvBase] = kb.regs("b32", 8);
  kb.op(
    `mov.u32 ${tid}, %tid.x;`,
    `mov.u32 ${i}, %ctaid.x;`,
    `mov.u32 ${h}, %ctaid.y;`,
    `mov.u32 ${b}, %ctaid.z;`,
    `div.u32 ${grp}, ${heads}, ${kvHeads};`,
    `div.u32 ${kvh}, ${h}, ${grp};`,
    `mad.lo.u32 ${qrow}, ${b}, ${heads}, ${h};`,
    `mad.lo.u32 ${qrow}, ${qrow}, ${sq}, ${i};`,
    `mad.lo.u32 ${kvBase}, ${b}, ${kvHeads}, ${kvh};`,
    `mul.lo.u32 ${kvBase}, ${kvBase}, ${skv};`,
  );
  const sa = kb.reg("b32");
  // q row → shared
  for (let d0 = 0; d0 < D; d0 += T) {
    const d = kb.reg("b32");
    const ok = kb.reg("pred");
    const x = kb.reg("f32");
    kb.op(`add.u32 ${d}, ${tid}, ${d0};`, `setp.lt.u32 ${ok}, ${d}, ${D};`);
    const gi = kb.reg("b32");
    kb.op(`mad.lo.u32 ${gi}, ${qrow}, ${D}, ${d};`);
    const qAt = kb.addr(q, gi, 4);
    kb.op(
      `@${ok} ld.global.f32 ${x}, [${qAt}];`,
      `mov.u32 ${sa}, ${qs};`,
      `mad.lo.u32 ${sa}, ${d}, 4, ${sa};`,
      `@${ok} st.shared.f32 [${sa}], ${x};`,
    );
  }
  kb.op("bar.sync 0;");
  const R = Math.ceil(Dv / T);
  const acc = kb.regs("f32", R);
  for (const a of acc) kb.op(`mov.f32 ${a}, 0f00000000;`);
  const m = kb.reg("f32");
  const l = kb.reg("f32");
  const j0 = kb.reg("b32");
  kb.op(`mov.f32 ${m}, 0fFF800000;`, `mov.f32 ${l}, 0f00000000;`, `mov.u32 ${j0}, 0;`);
  const pos = kb.reg("b32");
  kb.op(`add.s32 ${pos}, ${qOffset}, ${i};`);
  const top = kb.label("tile");
  const done = kb.label("tiles_done");
  const pq = kb.reg("pred");
  kb.place(top);
  kb.op(`setp.ge.u32 ${pq}, ${j0}, ${skv};`, `@${pq} bra ${done};`);
  // this thread's key and its score
  const j = kb.reg("b32");
  const sc = kb.reg("f32");
  const vis = kb.reg("pred");
  const scored = kb.label("scored");
  kb.op(`add.u32 ${j}, ${j0}, ${tid};`, `mov.f32 ${sc}, 0fFF800000;`, `setp.lt.u32 ${vis}, ${j}, ${skv};`);
  if (s.causal) {
    const c1 = kb.reg("pred");
    const c2 = kb.reg("pred");
    const lo = kb.reg("b32");
    const pre = kb.reg("pred");
    kb.op(
      `setp.le.s32 ${c1}, ${j}, ${pos};`,
      `sub.s32 ${lo}, ${pos}, ${window};`,
      `setp.gt.s32 ${c2}, ${j}, ${lo};`,
      `setp.eq.or.s32 ${c2}, ${window}, 0, ${c2};`,
      `and.pred ${c1}, ${c1}, ${c2};`,
      `setp.lt.s32 ${pre}, ${j}, ${fullPrefix};`,
      `or.pred ${c1}, ${c1}, ${pre};`,
      `and.pred ${vis}, ${vis}, ${c1};`,
    );
  }
  kb.op(`@!${vis} bra ${scored};`);
  {
    const dot = kb.reg("f32");
    const d = kb.reg("b32");
    const kaddr = kb.reg("b64");
    const krow = kb.reg("b32");
    const qa = kb.reg("b32");
    const loop = kb.label("dot");
    const pd = kb.reg("pred");
    const qv = kb.reg("f32");
    const kv = kb.reg("f32");
    kb.op(
      `add.u32 ${krow}, ${kvBase}, ${j};`,
      `mul.lo.u32 ${krow}, ${krow}, ${D};`,
      `mul.wide.u32 ${kaddr}, ${krow}, 4;`,
      `add.u64 ${kaddr}, ${kaddr}, ${k};`,
      `mov.u32 ${qa}, ${qs};`,
      `mov.f32 ${dot}, 0f00000000;`,
      `mov.u32 ${d}, 0;`,
    );
    kb.place(loop);
    kb.op(
      `ld.shared.f32 ${qv}, [${qa}];`,
      `ld.global.f32 ${kv}, [${kaddr}];`,
      `fma.rn.f32 ${dot}, ${qv}, ${kv}, ${dot};`,
      `add.u32 ${qa}, ${qa}, 4;`,
      `add.u64 ${kaddr}, ${kaddr}, 4;`,
      `add.u32 ${d}, ${d}, 1;`,
      `setp.lt.u32 ${pd}, ${d}, ${D};`,
      `@${pd} bra ${loop};`,
      `mul.f32 ${sc}, ${dot}, ${scale};`,
    );
    if (s.softcap) {
      const t = kb.reg("f32");
      kb.op(`div.rn.f32 ${t}, ${sc}, ${softcap};`);
      const th = kb.tanh(t);
      kb.op(`mul.f32 ${sc}, ${th}, ${softcap};`);
    }
  }
  kb.place(scored);
  const tileMax = kb.blockReduce(sc, "max", T);
  const mNew = kb.reg("f32");
  const none = kb.reg("pred");
  const next = kb.label("next");
  kb.op(
    `max.f32 ${mNew}, ${m}, ${tileMax};`,
    `setp.eq.f32 ${none}, ${mNew}, 0fFF800000;`,
    // block-uniform: every key so far is masked
    `@${none} bra ${next};`,
  );
  const p = kb.reg("f32");
  const masked = kb.reg("pred");
  const t = kb.reg("f32");
  kb.op(`sub.f32 ${t}, ${sc}, ${mNew};`);
  const e = kb.exp(t);
  kb.op(
    `setp.eq.f32 ${masked}, ${sc}, 0fFF800000;`,
    `selp.f32 ${p}, 0f00000000, ${e}, ${masked};`,
    `mov.u32 ${sa}, ${ps};`,
    `mad.lo.u32 ${sa}, ${tid}, 4, ${sa};`,
    `st.shared.f32 [${sa}], ${p};`,
  );
  const tileSum = kb.blockReduce(p, "add", T);
  const da = kb.reg("f32");
  kb.op(`sub.f32 ${da}, ${m}, ${mNew};`);
  const alpha = kb.exp(da);
  kb.op(`fma.rn.f32 ${l}, ${l}, ${alpha}, ${tileSum};`);
  for (const a of acc) kb.op(`mul.f32 ${a}, ${a}, ${alpha};`);
  // Σ_jj p_jj · v[j0 + jj][d] for this thread's output dims
  const cnt = kb.reg("b32");
  const jj = kb.reg("b32");
  const pj = kb.reg("f32");
  const vrow = kb.reg("b32");
  const loop = kb.label("pv");
  const loopEnd = kb.label("pv_done");
  const pl = kb.reg("pred");
  kb.op(
    `sub.u32 ${cnt}, ${skv}, ${j0};`,
    `min.u32 ${cnt}, ${cnt}, ${T};`,
    `mov.u32 ${jj}, 0;`,
    `add.u32 ${vrow}, ${kvBase}, ${j0};`,
  );
  kb.place(loop);
  kb.op(`setp.ge.u32 ${pl}, ${jj}, ${cnt};`, `@${pl} bra ${loopEnd};`);
  kb.op(`mov.u32 ${sa}, ${ps};`, `mad.lo.u32 ${sa}, ${jj}, 4, ${sa};`, `ld.shared.f32 ${pj}, [${sa}];`);
  acc.forEach((a, r) => {
    const d = kb.reg("b32");
    const ok = kb.reg("pred");
    const vi = kb.reg("b32");
    const vv = kb.reg("f32");
    kb.op(
      `add.u32 ${d}, ${tid}, ${r * T};`,
      `setp.lt.u32 ${ok}, ${d}, ${Dv};`,
      `add.u32 ${vi}, ${vrow}, ${jj};`,
      `mad.lo.u32 ${vi}, ${vi}, ${Dv}, ${d};`,
      `mov.f32 ${vv}, 0f00000000;`,
    );
    const vAt = kb.addr(v, vi, 4);
    kb.op(`@${ok} ld.global.f32 ${vv}, [${vAt}];`, `fma.rn.f32 ${a}, ${pj}, ${vv}, ${a};`);
  });
  kb.op(`add.u32 ${jj}, ${jj}, 1;`, `bra ${loop};`);
  kb.place(loopEnd);
  kb.op(`mov.f32 ${m}, ${mNew};`);
  kb.place(next);
  kb.op("bar.sync 0;", `add.u32 ${j0}, ${j0}, ${T};`, `bra ${top};`);
  kb.place(done);
  const inv = kb.reg("f32");
  const empty = kb.reg("pred");
  kb.op(
    `setp.eq.f32 ${empty}, ${l}, 0f00000000;`,
    `rcp.rn.f32 ${inv}, ${l};`,
    `selp.f32 ${inv}, 0f00000000, ${inv}, ${empty};`,
  );
  acc.forEach((a, r) => {
    const d = kb.reg("b32");
    const ok = kb.reg("pred");
    const oi = kb.reg("b32");
    kb.op(
      `add.u32 ${d}, ${tid}, ${r * T};`,
      `setp.lt.u32 ${ok}, ${d}, ${Dv};`,
      `mad.lo.u32 ${oi}, ${qrow}, ${Dv}, ${d};`,
      `mul.f32 ${a}, ${a}, ${inv};`,
    );
    const outAt = kb.addr(out, oi, 4);
    kb.op(`@${ok} st.global.f32 [${outAt}], ${a};`);
  });
  return kb.build([T, 1]);
}
