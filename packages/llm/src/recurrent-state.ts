/**
 * Per-sequence recurrent state beside the KV cache: for each linear-attention (Gated DeltaNet) layer of
 * a hybrid model (Qwen 3.5 / 3.6), the conv state — the last K − 1 inputs of the depthwise causal
 * conv, f32 [K − 1, channels] — and the delta-rule state, f32 [value_heads, key_dim, value_dim]. Unlike
 * keys and values, this state cannot be cut back to an earlier position, so it keeps **snapshots**:
 * copies taken at chosen positions (the end of a turn's prompt), to which a rollback returns
 * (a chat regenerating a turn, a prefix reused by the next prompt, rejected speculative tokens).
 *
 * The model updates the live tensors in place during a forward (`backend.ssmConv` reads the conv
 * state, `backend.set` writes it; `backend.gatedDeltaNet` updates the delta-rule state), between
 * {@link RecurrentState.begin} and {@link RecurrentState.commit}. A forward that fails in between
 * leaves the state dirty; the next {@link RecurrentState.restore} then goes back to a snapshot.
 *
 * Source: ../shared/spec/llm.md §3.4 ("State per sequence"), §7.3 item 6 (turn-boundary checkpoints:
 * Qwen 3.5 snapshots conv + recurrent state + position); llama.cpp `llama-memory-recurrent.cpp`
 * (one conv and one ssm state per sequence and layer).
 */
import { type Backend, type Tensor, TpError } from "@tp/tensor";

/** Sizes of a {@link RecurrentState}. */
export interface RecurrentStateShape {
  /** Linear-attention layers (one conv and one delta-rule state each). */
  readonly layers: number;
  /** Conv channels: 2 · key_heads · key_dim + value_heads · value_dim. */
  readonly convChannels: number;
  /** Conv taps K (the state keeps K − 1 inputs). */
  readonly convKernel: number;
  readonly valueHeads: number;
  readonly keyDim: number;
  readonly valueDim: number;
}

/** Snapshots kept by default (the newest; llm.md §7.3 item 6 keeps one per turn boundary). */
export const DEFAULT_STATE_SNAPSHOTS = 3;

interface Snapshot {
  readonly position: number;
  readonly tensors: Tensor[];
}

function sizeOf(name: string, v: number, min: number): number {
  if (!Number.isSafeInteger(v) || v < min) {
    throw new TpError("E_ARG", `recurrent state ${name} must be an integer ≥ ${min}, got ${String(v)}`);
  }
  return v;
}

/**
 * The conv and delta-rule states of every linear-attention layer of one sequence, zero at position 0,
 * with snapshots.
 * @example
 * const s = new RecurrentState(backend, shape);
 * s.begin();                      // before a forward of n rows
 * b.ssmConv(..., s.conv(l)); b.gatedDeltaNet(..., s.ssm(l));  // updated in place
 * s.commit(n);                    // after every layer ran
 * s.snapshot();                   // keep a copy at s.length
 * s.restore(p);                   // back to the newest snapshot at or before p: returns its position
 */
export class RecurrentState {
  readonly backend: Backend;
  readonly shape: RecurrentStateShape;
  readonly maxSnapshots: number;
  /** conv[l], ssm[l] interleaved: [conv 0, ssm 0, conv 1, ssm 1, …] */
  #live: Tensor[] = [];
  #snapshots: Snapshot[] = [];
  #length = 0;
  #dirty = false;
  #disposed = false;

  /**
   * @param maxSnapshots the newest snapshots kept (older ones are freed); 0 keeps none (a rollback then
   *   returns to position 0)
   * @throws TpError E_ARG for a bad size; E_OOM from the backend
   */
  constructor(backend: Backend, shape: RecurrentStateShape, maxSnapshots = DEFAULT_STATE_SNAPSHOTS) {
    this.backend = backend;
    this.shape = {
      layers: sizeOf("layers", shape.layers, 0),
      convChannels: sizeOf("convChannels", shape.convChannels, 1),
      convKernel: sizeOf("convKernel", shape.convKernel, 1),
      valueHeads: sizeOf("valueHeads", shape.valueHeads, 1),
      keyDim: sizeOf("keyDim", shape.keyDim, 1),
      valueDim: sizeOf("valueDim", shape.valueDim, 1),
    };
    this.maxSnapshots = sizeOf("maxSnapshots", maxSnapshots, 0);
    this.#live = this.#zeros();
  }

  /** Tokens the state has seen (the next position). */
  get length(): number {
    return this.#length;
  }
  /** Positions of the snapshots held, oldest first. */
  get snapshots(): number[] {
    return this.#snapshots.map((s) => s.position);
  }
  /** Backend bytes of the live state and its snapshots (f32). */
  get bytes(): number {
    const s = this.shape;
    const one = s.layers * ((s.convKernel - 1) * s.convChannels + s.valueHeads * s.keyDim * s.valueDim) * 4;
    return one * (1 + this.#snapshots.length);
  }

  /** The conv state of linear layer `l`: f32 [K − 1, channels], read and written in place by the forward. */
  conv(l: number): Tensor {
    return this.#tensor(2 * l, l);
  }
  /** The delta-rule state of linear layer `l`: f32 [value_heads, key_dim, value_dim], updated in place. */
  ssm(l: number): Tensor {
    return this.#tensor(2 * l + 1, l);
  }

  /** A forward starts changing the live state (it is dirty until {@link commit}). @throws TpError E_STATE */
  begin(): void {
    this.#assertLive();
    this.#dirty = true;
  }

  /** The forward of `n` rows ran in every layer: the state is at length + n. @throws TpError E_STATE, E_ARG */
  commit(n: number): void {
    this.#assertLive();
    if (!Number.isSafeInteger(n) || n < 0) {
      throw new TpError("E_ARG", `recurrent state commit: n must be a non-negative integer, got ${n}`);
    }
    this.#length += n;
    this.#dirty = false;
  }

  /**
   * Keep a copy of the live state at the current length (replacing one at the same position; the
   * oldest is freed past maxSnapshots). Nothing at position 0 (the zero state needs no copy).
   * @throws TpError E_STATE while dirty or after dispose; E_OOM (nothing changes then)
   */
  snapshot(): void {
    this.#assertLive();
    if (this.#dirty) throw new TpError("E_STATE", "recurrent state: no snapshot of a half-run forward");
    if (this.maxSnapshots === 0 || this.#length === 0) return;
    const b = this.backend;
    const tensors = b.persist(b.scope(() => this.#live.map((t) => b.copy(t))));
    this.#drop((s) => s.position === this.#length);
    this.#snapshots.push({ position: this.#length, tensors });
    while (this.#snapshots.length > this.maxSnapshots) this.#free(this.#snapshots.shift() as Snapshot);
  }

  /**
   * Go back to at most `len` tokens: to the current state when len = length and nothing is dirty,
   * else to the newest snapshot at or before `len` (position 0: zeros). Snapshots past the
   * position returned are freed.
   * @returns the position the state is at now (≤ len): the caller truncates the KV cache to it
   * @throws TpError E_ARG for len outside [0, length]; E_STATE after dispose
   */
  restore(len: number): number {
    this.#assertLive();
    if (!Number.isSafeInteger(len) || len < 0 || len > this.#length) {
      throw new TpError(
        "E_ARG",
        `recurrent state restore: length must be in [0, ${this.#length}], got ${len}`,
      );
    }
    if (len === this.#length && !this.#dirty) return len;
    this.#drop((s) => s.position > len);
    const snap = this.#snapshots[this.#snapshots.length - 1];
    const b = this.backend;
    if (snap === undefined) {
      const zeros = this.#zeros();
      for (const t of this.#live) b.free(t);
      this.#live = zeros;
      this.#length = 0;
    } else {
      for (let i = 0; i < this.#live.length; i++) b.set(this.#live[i] as Tensor, snap.tensors[i] as Tensor);
      this.#length = snap.position;
    }
    this.#dirty = false;
    return this.#length;
  }

  /** Free the live state and every snapshot; the state is unusable afterwards. Idempotent. */
  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    for (const t of this.#live) this.backend.free(t);
    this.#live = [];
    for (const s of this.#snapshots) this.#free(s);
    this.#snapshots = [];
  }

  #zeros(): Tensor[] {
    const b = this.backend;
    const s = this.shape;
    const conv: [number, number] = [s.convKernel - 1, s.convChannels];
    const ssm: [number, number, number] = [s.valueHeads, s.keyDim, s.valueDim];
    const zc = new Float32Array(conv[0] * conv[1]);
    const zs = new Float32Array(ssm[0] * ssm[1] * ssm[2]);
    return b.persist(
      b.scope(() => {
        const out: Tensor[] = [];
        for (let l = 0; l < s.layers; l++) {
          out.push(b.upload(zc, conv, "f32", `recurrent.${l}.conv`));
          out.push(b.upload(zs, ssm, "f32", `recurrent.${l}.ssm`));
        }
        return out;
      }),
    );
  }

  #drop(which: (s: Snapshot) => boolean): void {
    for (const s of this.#snapshots.filter(which)) this.#free(s);
    this.#snapshots = this.#snapshots.filter((s) => !which(s));
  }

  #free(s: Snapshot): void {
    for (const t of s.tensors) if (!t.storage.freed) this.backend.free(t);
  }

  #tensor(i: number, l: number): Tensor {
    this.#assertLive();
    const t = this.#live[i];
    if (t === undefined) {
      throw new TpError("E_STATE", `recurrent state: no layer ${l} (${this.shape.layers} linear layers)`);
    }
    return t;
  }

  #assertLive(): void {
    if (this.#disposed) throw new TpError("E_STATE", "the recurrent state was disposed");
  }
}
