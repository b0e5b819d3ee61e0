/**
 * A model of cuBLASLt for tests without a GPU: handles, descriptors and layouts as records, "device
 * memory" as byte arrays at fake addresses, the heuristic answering one algorithm, and cublasLtMatmul
 * computing D = α·op(A)·op(B) (+ bias) (·scale_A·scale_B for fp8) in float64 from the layouts exactly as
 * the cuBLAS documentation defines them (column-major, element (i, j) of a rows × cols matrix at
 * i + j·ld; op(A) = Aᵀ for TRANSA = T). A layout that does not fit the product is
 * CUBLAS_STATUS_INVALID_VALUE, as the library answers. Used by the tests, and by the cuda backend on the
 * PTX simulator (computing on the simulator's memory: `view`), where no real library can run.
 */
import type { CublasLtSymbols } from "./cublaslt.ts";
import {
  CUBLAS_OP,
  CUBLAS_STATUS,
  CUBLASLT_EPILOGUE,
  CUBLASLT_MATMUL_DESC,
  CUBLASLT_SIZES,
  CUDA_DATA_TYPE,
} from "./nvidia-h.ts";

const T = CUDA_DATA_TYPE;
const D = CUBLASLT_MATMUL_DESC;

/** IEEE binary16 / bfloat16 / fp8 e4m3 bits → value. */
function half(bits: number): number {
  const s = bits & 0x8000 ? -1 : 1;
  const e = (bits >> 10) & 31;
  const m = bits & 1023;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m ? Number.NaN : s * Number.POSITIVE_INFINITY;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}
function bf16(bits: number): number {
  const b = new DataView(new ArrayBuffer(4));
  b.setUint32(0, bits << 16);
  return b.getFloat32(0);
}
/** The bf16 bits of `v` by truncation (exact for values bf16 holds, as the tests use). */
export function bf16Bits(v: number): number {
  return (new Uint32Array(new Float32Array([v]).buffer)[0] as number) >>> 16;
}
export function e4m3(bits: number): number {
  const s = bits & 0x80 ? -1 : 1;
  const e = (bits >> 3) & 15;
  const m = bits & 7;
  if (e === 15 && m === 7) return Number.NaN;
  return e === 0 ? s * (m / 8) * 2 ** -6 : s * (1 + m / 8) * 2 ** (e - 7);
}

/** The fake and its observable state. */
export function fakeCublasLt(
  options: {
    failCreate?: number;
    failMatmul?: number;
    noAlgoFor?: number;
    /** Device memory to compute on (the PTX simulator's), instead of the model's own byte arrays. */
    view?: (address: bigint) => DataView;
  } = {},
) {
  let next = 0x100;
  let nextAddr = 0x7000_0000n;
  const memory = new Map<bigint, Uint8Array>();
  const descs = new Map<number, { compute: number; scale: number; attrs: Map<number, bigint> }>();
  const layouts = new Map<number, { type: number; rows: number; cols: number; ld: number }>();
  const prefs = new Map<number, Map<number, bigint>>();
  const calls: string[] = [];
  const put = (out: BigUint64Array, v: number) => {
    out[0] = BigInt(v);
  };
  const view = (addr: bigint): DataView => {
    if (options.view !== undefined) return options.view(addr);
    for (const [base, bytes] of memory) {
      if (addr >= base && addr < base + BigInt(bytes.byteLength))
        return new DataView(bytes.buffer, bytes.byteOffset + Number(addr - base));
    }
    throw new Error(`fake cuBLASLt: address ${addr} is not allocated`);
  };
  const read = (v: DataView, type: number, i: number): number => {
    switch (type) {
      case T.CUDA_R_32F:
        return v.getFloat32(4 * i, true);
      case T.CUDA_R_16F:
        return half(v.getUint16(2 * i, true));
      case T.CUDA_R_16BF:
        return bf16(v.getUint16(2 * i, true));
      case T.CUDA_R_8I:
        return v.getInt8(i);
      case T.CUDA_R_32I:
        return v.getInt32(4 * i, true);
      case T.CUDA_R_8F_E4M3:
        return e4m3(v.getUint8(i));
      default:
        throw new Error(`fake cuBLASLt: type ${type}`);
    }
  };
  const symbols: CublasLtSymbols = {
    cublasLtCreate: (out: BigUint64Array) => {
      if (options.failCreate) return options.failCreate;
      put(out, next++);
      return 0;
    },
    cublasLtDestroy: () => {
      calls.push("destroy");
      return 0;
    },
    cublasLtGetVersion: () => 130001n,
    cublasLtGetStatusString: () => 0,
    cublasLtMatmulDescCreate: (out: BigUint64Array, compute: number, scale: number) => {
      const h = next++;
      descs.set(h, { compute, scale, attrs: new Map() });
      put(out, h);
      return 0;
    },
    cublasLtMatmulDescDestroy: (h: number) =>
      descs.delete(h) ? 0 : CUBLAS_STATUS.CUBLAS_STATUS_INVALID_VALUE,
    cublasLtMatmulDescSetAttribute: (h: number, attr: number, buf: ArrayBufferView, size: number) => {
      const d = descs.get(h);
      if (d === undefined || size !== buf.byteLength) return CUBLAS_STATUS.CUBLAS_STATUS_INVALID_VALUE;
      const v = new DataView(buf.buffer, buf.byteOffset);
      d.attrs.set(attr, size === 8 ? v.getBigUint64(0, true) : BigInt(v.getInt32(0, true)));
      return 0;
    },
    cublasLtMatrixLayoutCreate: (
      out: BigUint64Array,
      type: number,
      rows: number,
      cols: number,
      ld: number,
    ) => {
      if (ld < rows) return CUBLAS_STATUS.CUBLAS_STATUS_INVALID_VALUE;
      const h = next++;
      layouts.set(h, { type, rows: Number(rows), cols: Number(cols), ld: Number(ld) });
      put(out, h);
      return 0;
    },
    cublasLtMatrixLayoutDestroy: (h: number) =>
      layouts.delete(h) ? 0 : CUBLAS_STATUS.CUBLAS_STATUS_INVALID_VALUE,
    cublasLtMatmulPreferenceCreate: (out: BigUint64Array) => {
      const h = next++;
      prefs.set(h, new Map());
      put(out, h);
      return 0;
    },
    cublasLtMatmulPreferenceDestroy: (h: number) =>
      prefs.delete(h) ? 0 : CUBLAS_STATUS.CUBLAS_STATUS_INVALID_VALUE,
    cublasLtMatmulPreferenceSetAttribute: (h: number, attr: number, buf: BigUint64Array) => {
      prefs.get(h)?.set(attr, buf[0] as bigint);
      return 0;
    },
    cublasLtMatmulAlgoGetHeuristic: (
      _handle: number,
      desc: number,
      a: number,
      _b: number,
      _c: number,
      _d: number,
      _pref: number,
      requested: number,
      results: Uint8Array,
      count: Int32Array,
    ) => {
      calls.push(`heuristic ${requested}`);
      if (options.noAlgoFor === layouts.get(a)?.type) return CUBLAS_STATUS.CUBLAS_STATUS_NOT_SUPPORTED;
      if (
        descs.get(desc) === undefined ||
        results.byteLength < CUBLASLT_SIZES.cublasLtMatmulHeuristicResult_t
      )
        return CUBLAS_STATUS.CUBLAS_STATUS_INVALID_VALUE;
      const v = new DataView(results.buffer, results.byteOffset);
      v.setBigUint64(CUBLASLT_SIZES["cublasLtMatmulHeuristicResult_t.workspaceSize"], 4096n, true);
      v.setInt32(CUBLASLT_SIZES["cublasLtMatmulHeuristicResult_t.state"], 0, true);
      count[0] = 1;
      return 0;
    },
    cublasLtMatmul: (
      _handle: number,
      desc: number,
      alpha: Float32Array | Int32Array,
      A: bigint,
      la: number,
      B: bigint,
      lb: number,
      beta: Float32Array | Int32Array,
      C: bigint,
      lc: number,
      Dp: bigint,
      ld: number,
      _algo: Uint8Array,
      _ws: bigint,
      _wsBytes: number,
      _stream: number,
    ) => {
      calls.push("matmul");
      if (options.failMatmul) return options.failMatmul;
      const d = descs.get(desc);
      const [a, b, c, o] = [la, lb, lc, ld].map((h) => layouts.get(h));
      if (
        d === undefined ||
        a === undefined ||
        b === undefined ||
        c === undefined ||
        o === undefined ||
        C !== Dp
      )
        return CUBLAS_STATUS.CUBLAS_STATUS_INVALID_VALUE;
      const ta = d.attrs.get(D.CUBLASLT_MATMUL_DESC_TRANSA) === BigInt(CUBLAS_OP.CUBLAS_OP_T);
      const tb = d.attrs.get(D.CUBLASLT_MATMUL_DESC_TRANSB) === BigInt(CUBLAS_OP.CUBLAS_OP_T);
      const [m, k] = ta ? [a.cols, a.rows] : [a.rows, a.cols];
      const [kb, n] = tb ? [b.cols, b.rows] : [b.rows, b.cols];
      if (k !== kb || o.rows !== m || o.cols !== n) return CUBLAS_STATUS.CUBLAS_STATUS_INVALID_VALUE;
      const epi = Number(
        d.attrs.get(D.CUBLASLT_MATMUL_DESC_EPILOGUE) ?? BigInt(CUBLASLT_EPILOGUE.CUBLASLT_EPILOGUE_DEFAULT),
      );
      const biasAddr = d.attrs.get(D.CUBLASLT_MATMUL_DESC_BIAS_POINTER);
      const scaleOf = (attr: number) => {
        const p = d.attrs.get(attr);
        return p === undefined || p === 0n ? 1 : view(p).getFloat32(0, true);
      };
      const s =
        scaleOf(D.CUBLASLT_MATMUL_DESC_A_SCALE_POINTER) * scaleOf(D.CUBLASLT_MATMUL_DESC_B_SCALE_POINTER);
      const [va, vb, vd] = [view(A), view(B), view(Dp)];
      if ((beta[0] as number) !== 0) return CUBLAS_STATUS.CUBLAS_STATUS_NOT_SUPPORTED;
      for (let i = 0; i < m; i++) {
        for (let j = 0; j < n; j++) {
          let acc = 0;
          for (let l = 0; l < k; l++) {
            const ea = ta ? l + i * a.ld : i + l * a.ld;
            const eb = tb ? j + l * b.ld : l + j * b.ld;
            acc += read(va, a.type, ea) * read(vb, b.type, eb);
          }
          acc *= (alpha[0] as number) * s;
          if (epi === CUBLASLT_EPILOGUE.CUBLASLT_EPILOGUE_BIAS) {
            if (biasAddr === undefined) return CUBLAS_STATUS.CUBLAS_STATUS_INVALID_VALUE;
            acc += view(biasAddr).getFloat32(4 * i, true);
          }
          const at = i + j * o.ld;
          if (o.type === T.CUDA_R_32I) vd.setInt32(4 * at, acc, true);
          else vd.setFloat32(4 * at, acc, true);
        }
      }
      return 0;
    },
  };
  return {
    symbols,
    calls,
    descs,
    layouts,
    prefs,
    /** "Device" memory holding `bytes`; returns its address. */
    device(bytes: Uint8Array): bigint {
      const a = nextAddr;
      nextAddr += BigInt(Math.ceil(bytes.byteLength / 256) * 256 + 256);
      memory.set(a, bytes);
      return a;
    },
  };
}
