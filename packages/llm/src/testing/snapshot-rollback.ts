/** Test helper (not exported from the package): a model that rolls back only to snapshots. */
import type { CausalLM, StepOptions } from "../model.ts";

/**
 * A model whose `truncate` can only return to a snapshot (the newest at or before the length asked),
 * as a model with recurrent state does: the engine must replay the accepted tokens past it.
 */
export class SnapshotRollback implements CausalLM {
  #snaps = [0];
  restores = 0;
  constructor(readonly inner: CausalLM) {}
  get config() {
    return this.inner.config;
  }
  get backend() {
    return this.inner.backend;
  }
  get file() {
    return this.inner.file;
  }
  get cached() {
    return this.inner.cached;
  }
  get maxContext() {
    return this.inner.maxContext;
  }
  get capacity() {
    return this.inner.capacity;
  }
  get kvBytes() {
    return this.inner.kvBytes;
  }
  step(ids: Int32Array | readonly number[], options?: StepOptions) {
    return this.inner.step(ids, options);
  }
  stepCollect(ids: Int32Array | readonly number[], collect: readonly number[], options?: StepOptions) {
    if (this.inner.stepCollect === undefined) throw new Error("the wrapped model cannot tap");
    return this.inner.stepCollect(ids, collect, options);
  }
  snapshot(): void {
    this.#snaps.push(this.inner.cached);
  }
  truncate(len: number): void {
    const to = Math.max(...this.#snaps.filter((x) => x <= len));
    if (to < len) this.restores++;
    this.#snaps = this.#snaps.filter((x) => x <= to);
    this.inner.truncate(to);
  }
  dispose(): void {
    this.inner.dispose();
  }
}
