/**
 * One conformance case: inputs (host data, dtype, and how the op sees them: contiguous, through a
 * permutation, every other element, or broadcast), the op call, and the reference outputs. `run`
 * uploads the inputs, makes the views, calls the op on a backend, reads every output back and frees
 * every tensor it made; {@link runCase} then checks the outputs and that the backend's memory is back
 * where it was (no leaked scratch).
 */
import type { Backend, DTypeName, HostArray, OpName, Tensor, Weight, WeightFormat } from "@tp/tensor";
import { compare } from "./compare.ts";
import { broadcastIndex, type HostTensor, numelOf, ravel, unravel } from "./host.ts";
import type { Tolerance } from "./tolerances.ts";

/** How the op sees an input. */
export type ViewSpec =
  /** a plain contiguous tensor */
  | { readonly kind: "contiguous" }
  /** stored permuted, seen through `permute(...perm)`: strided, not contiguous */
  | { readonly kind: "permute"; readonly perm: readonly number[] }
  /** every other element of a buffer twice as long in the last dimension (NaN / 0x7f… between) */
  | { readonly kind: "stride2" }
  /** stored with shape `from` (the `data`), seen through broadcastTo(shape): stride 0 */
  | { readonly kind: "broadcast"; readonly from: readonly number[] };

/** An input of a case. */
export interface InputSpec {
  /** For messages ("x", "gate"). */
  readonly name: string;
  readonly dtype: DTypeName;
  /** The shape the op sees. */
  readonly shape: readonly number[];
  /** Row-major values of the shape the op sees (for "broadcast": of `from`). */
  readonly data: HostArray;
  /** Default contiguous. */
  readonly view?: ViewSpec;
}

/** A reference output: its shape, dtype and row-major values. */
export interface Expected {
  readonly shape: readonly number[];
  readonly dtype: DTypeName;
  readonly data: ArrayLike<number>;
}

/** An output read back from a backend. */
export interface Actual {
  readonly shape: readonly number[];
  readonly dtype: DTypeName;
  readonly data: HostArray;
}

/** What an op call returns. */
export type OpResult = Tensor | readonly Tensor[] | { readonly values: Tensor; readonly indices: Tensor };

/** A conformance case (build it with {@link defineCase}). */
export interface ConformanceCase {
  /** The Backend op it checks. */
  readonly op: OpName;
  /** Shapes and options, for the test name. */
  readonly name: string;
  /** Weight formats / dtypes asked of `supports(op, formats)`. */
  readonly formats: readonly (WeightFormat | DTypeName)[];
  readonly tolerance: Tolerance;
  /** Why the case cannot run here (a missing fixture), or undefined. */
  readonly skip?: string;
  /** Upload, call, read back, free. */
  run(backend: Backend): Promise<Actual[]>;
  /** Reference outputs (computed once). */
  expected(): readonly Expected[];
}

/** Arguments of {@link defineCase}. */
export interface CaseInit {
  readonly op: OpName;
  readonly name: string;
  readonly formats?: readonly (WeightFormat | DTypeName)[];
  readonly tolerance: Tolerance;
  readonly skip?: string;
  readonly inputs: readonly InputSpec[];
  /** Weights for matmul / embedding (host objects; the backend uploads or streams them itself). */
  readonly weights?: readonly Weight[];
  /** The op call on the views of the inputs. */
  readonly call: (backend: Backend, inputs: Tensor[], weights: readonly Weight[]) => OpResult;
  /** The reference, on the logical host data of the inputs (as the op sees them). */
  readonly reference: (inputs: HostTensor<HostArray>[]) => readonly Expected[];
}

/** The logical data of an input: what the op sees, row-major (broadcasts expanded). */
export function logicalData(spec: InputSpec): HostArray {
  if (spec.view?.kind !== "broadcast") return spec.data;
  const from = spec.view.from;
  const out = newLike(spec.data, numelOf(spec.shape));
  for (let i = 0; i < out.length; i++) {
    (out as unknown as unknown[])[i] = (spec.data as unknown as unknown[])[
      broadcastIndex(unravel(i, spec.shape), from, spec.shape)
    ];
  }
  return out;
}

function newLike(a: HostArray, n: number): HostArray {
  const C = a.constructor as new (n: number) => HostArray;
  return new C(n);
}

/** Upload an input and make the view the op sees. Returns [base tensor to free, view]. */
function uploadInput(b: Backend, spec: InputSpec): [Tensor, Tensor] {
  const view = spec.view ?? { kind: "contiguous" };
  if (view.kind === "contiguous") {
    const t = b.upload(spec.data, spec.shape, spec.dtype, spec.name);
    return [t, t];
  }
  if (view.kind === "broadcast") {
    const t = b.upload(spec.data, view.from, spec.dtype, spec.name);
    return [t, t.broadcastTo(spec.shape)];
  }
  if (view.kind === "permute") {
    const perm = view.perm;
    const phys = new Array<number>(spec.shape.length);
    perm.forEach((p, i) => {
      phys[p] = spec.shape[i] as number;
    });
    const stored = newLike(spec.data, spec.data.length);
    const pidx = new Array<number>(spec.shape.length);
    for (let i = 0; i < spec.data.length; i++) {
      const idx = unravel(i, spec.shape);
      perm.forEach((p, d) => {
        pidx[p] = idx[d] as number;
      });
      (stored as unknown as unknown[])[ravel(pidx, phys)] = (spec.data as unknown as unknown[])[i];
    }
    const t = b.upload(stored, phys, spec.dtype, spec.name);
    return [t, t.permute(...perm)];
  }
  // stride2: the last dimension doubled, the op's elements at even positions, filler between
  const last = spec.shape[spec.shape.length - 1] as number;
  const phys = [...spec.shape.slice(0, -1), 2 * last];
  const stored = newLike(spec.data, spec.data.length * 2);
  if (stored instanceof Float32Array || stored instanceof Float64Array) stored.fill(Number.NaN);
  else if (stored instanceof BigInt64Array || stored instanceof BigUint64Array) stored.fill(0x7f7f7f7fn);
  else stored.fill(0x7f);
  for (let i = 0; i < spec.data.length; i++) {
    (stored as unknown as unknown[])[2 * i] = (spec.data as unknown as unknown[])[i];
  }
  const t = b.upload(stored, phys, spec.dtype, spec.name);
  return [t, t.slice(-1, 0, 2 * last, 2)];
}

function outputs(r: OpResult): Tensor[] {
  if (Array.isArray(r)) return [...r];
  if ("values" in (r as object) && "indices" in (r as object)) {
    const p = r as { values: Tensor; indices: Tensor };
    return [p.values, p.indices];
  }
  return [r as Tensor];
}

/** Build a case from inputs, an op call and a reference. */
export function defineCase(init: CaseInit): ConformanceCase {
  let cached: readonly Expected[] | undefined;
  return {
    op: init.op,
    name: init.name,
    formats: init.formats ?? ["f32"],
    tolerance: init.tolerance,
    ...(init.skip === undefined ? {} : { skip: init.skip }),
    expected() {
      cached ??= init.reference(init.inputs.map((s) => ({ shape: s.shape, data: logicalData(s) })));
      return cached;
    },
    async run(backend) {
      const bases: Tensor[] = [];
      const produced: Tensor[] = [];
      try {
        const views = init.inputs.map((spec) => {
          const [base, v] = uploadInput(backend, spec);
          bases.push(base);
          return v;
        });
        produced.push(...outputs(init.call(backend, views, init.weights ?? [])));
        const out: Actual[] = [];
        for (const t of produced)
          out.push({ shape: [...t.shape], dtype: t.dtype, data: await backend.read(t) });
        return out;
      } finally {
        for (const t of [...produced, ...bases]) if (!t.storage.freed) backend.free(t);
      }
    },
  };
}

/**
 * Run a case and check it: output count, shapes, dtypes, values within the tolerance, and the
 * backend's memory back to where it was. Returns the problems found ([] when it passes).
 */
export async function runCase(backend: Backend, c: ConformanceCase): Promise<string[]> {
  const before = backend.memory.current;
  const actual = await c.run(backend);
  const problems: string[] = [];
  const leaked = backend.memory.current - before;
  if (leaked !== 0) problems.push(`backend memory changed by ${leaked} bytes (scratch not freed?)`);
  const expected = c.expected();
  if (actual.length !== expected.length) {
    problems.push(`${actual.length} outputs, expected ${expected.length}`);
    return problems;
  }
  expected.forEach((e, i) => {
    const a = actual[i] as Actual;
    const what = expected.length > 1 ? `output ${i}: ` : "";
    if (a.shape.length !== e.shape.length || a.shape.some((d, k) => d !== e.shape[k])) {
      problems.push(`${what}shape [${a.shape}], expected [${e.shape}]`);
      return;
    }
    if (a.dtype !== e.dtype) {
      problems.push(`${what}dtype ${a.dtype}, expected ${e.dtype}`);
      return;
    }
    const data =
      a.data instanceof BigInt64Array || a.data instanceof BigUint64Array
        ? Array.from(a.data, Number)
        : a.data;
    const m = compare(data as ArrayLike<number>, e.data, c.tolerance);
    if (m !== null) problems.push(`${what}${m}`);
  });
  return problems;
}
