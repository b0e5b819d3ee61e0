/**
 * The simulated GPU: global memory (one arena, allocations checked on every access: a load or store
 * outside a live allocation, or misaligned for its size, is an error naming the kernel, the
 * instruction and the address), kernel launches (blocks one after another; in a block, each thread's
 * generator runs until it reaches a warp- or block-wide instruction), and those instructions resolved
 * once every thread they involve has arrived: bar.sync (the block), shfl.sync / vote.sync (the lanes
 * of the member mask, which must all be there and not exited), mma.sync and ldmatrix (the whole warp).
 * A block whose threads can no longer all progress is a deadlock error saying where each one waits.
 *
 * Fresh device memory and shared memory are filled with 0xff bytes (NaN as f32/f16/bf16), so a kernel
 * that reads what it never wrote shows NaN instead of a lucky zero.
 *
 * Source: NVIDIA PTX ISA 8.x: shfl.sync (§9.7.8.6, its pseudocode for up / down / bfly / idx, the
 * clamp and segment mask in c), vote.sync (§9.7.8.10), bar.sync (§9.7.13.1), the mma.sync fragment
 * layouts for m16n8k8 / m16n8k16 / m16n8k32 / m16n8k64 (§9.7.14.5.x: "groupID = laneid >> 2,
 * threadID_in_group = laneid % 4"), ldmatrix (§9.7.14.5.15).
 */
import { TpError } from "@tp/tensor";
import { BASE_ADDRESS, type CompiledKernel } from "./compile.ts";
import * as numeric from "./numeric.ts";

/** One live allocation of simulated device memory. */
interface Region {
  readonly start: number;
  readonly bytes: number;
}

/** The helpers every compiled kernel calls (through its `M`), shared by all kernels. */
const HELPERS = {
  ...numeric,
  lo32(x: number | bigint): number {
    return typeof x === "bigint" ? Number(x & 0xffffffffn) : x >>> 0;
  },
  num64(x: number | bigint): number {
    return typeof x === "bigint" ? Number(BigInt.asIntN(64, x)) : x;
  },
  toBig(x: number | bigint): bigint {
    return BigInt.asUintN(64, BigInt(x));
  },
  pack64(lo: number, hi: number): number | bigint {
    return hi < 2 ** 21 ? hi * 2 ** 32 + lo : (BigInt(hi) << 32n) | BigInt(lo);
  },
  ld64(u32: Uint32Array, idx: number): number | bigint {
    const lo = u32[idx >>> 2] as number;
    const hi = u32[(idx >>> 2) + 1] as number;
    return hi < 2 ** 21 ? hi * 2 ** 32 + lo : (BigInt(hi) << 32n) | BigInt(lo);
  },
  st64(u32: Uint32Array, idx: number, v: number | bigint): void {
    let lo: number;
    let hi: number;
    if (typeof v === "number" && v >= 0 && v <= Number.MAX_SAFE_INTEGER) {
      lo = v >>> 0;
      hi = Math.floor(v / 2 ** 32);
    } else {
      const b = BigInt.asUintN(64, BigInt(v));
      lo = Number(b & 0xffffffffn);
      hi = Number(b >> 32n);
    }
    u32[idx >>> 2] = lo;
    u32[(idx >>> 2) + 1] = hi;
  },
  wide(v: number): number {
    if (!Number.isSafeInteger(v))
      throw new TpError("E_UNSUPPORTED", `PTX simulator: a 64-bit integer result ${v} is past 2^53`);
    return v;
  },
  mulhiU(a: number, b: number): number {
    return Number((BigInt(a) * BigInt(b)) >> 32n) >>> 0;
  },
  mulhiS(a: number, b: number): number {
    return Number((BigInt(a) * BigInt(b)) >> 32n) | 0;
  },
  divU(a: number, b: number): number {
    return b === 0 ? 0xffffffff : Math.floor(a / b);
  },
  divS(a: number, b: number): number {
    return b === 0 ? -1 : Math.trunc(a / b);
  },
  remU(a: number, b: number): number {
    return b === 0 ? a : a % b;
  },
  remS(a: number, b: number): number {
    return b === 0 ? a : a % b;
  },
  divU64(a: number, b: number): number {
    return b === 0 ? Number.MAX_SAFE_INTEGER : Math.floor(a / b);
  },
  remU64(a: number, b: number): number {
    return b === 0 ? a : a % b;
  },
  sat32(v: number): number {
    return Math.max(-(2 ** 31), Math.min(2 ** 31 - 1, v));
  },
  sat01(v: number): number {
    return Number.isNaN(v) ? 0 : Math.max(0, Math.min(1, v));
  },
  fma64(a: number, b: number, c: number): number {
    return a * b + c;
  },
  copysign(mag: number, sign: number): number {
    const neg =
      sign < 0 || Object.is(sign, -0) || (Number.isNaN(sign) && numeric.floatBits(sign) >>> 31 === 1);
    const m = Math.abs(mag);
    return neg ? -m : m;
  },
  popc(x: number): number {
    let n = 0;
    for (let v = x >>> 0; v !== 0; v &= v - 1) n++;
    return n;
  },
  brev(x: number): number {
    let r = 0;
    for (let i = 0; i < 32; i++) r = (r << 1) | ((x >>> i) & 1);
    return r >>> 0;
  },
  bfe(a: number, pos: number, len: number, signed: boolean): number {
    const p = pos & 0xff;
    const l = len & 0xff;
    if (l === 0) return 0;
    const v = p >= 32 ? 0 : a >>> p;
    const mask = l >= 32 ? 0xffffffff : (1 << l) - 1;
    let r = (v & mask) >>> 0;
    if (signed) {
      const top = Math.min(p + l, 32) - 1;
      const sbit = top < 0 ? 0 : (a >>> top) & 1;
      if (sbit && l < 32) r = (r | ~mask) >>> 0;
    }
    return r;
  },
  bfi(a: number, b: number, pos: number, len: number): number {
    const p = pos & 0xff;
    const l = len & 0xff;
    if (l === 0 || p > 31) return b;
    const mask = (l >= 32 ? 0xffffffff : ((1 << l) - 1) << p) >>> 0;
    return ((b & ~mask) | ((a << p) & mask)) >>> 0;
  },
  prmt(a: number, b: number, c: number): number {
    const bytes = [
      a & 0xff,
      (a >>> 8) & 0xff,
      (a >>> 16) & 0xff,
      a >>> 24,
      b & 0xff,
      (b >>> 8) & 0xff,
      (b >>> 16) & 0xff,
      b >>> 24,
    ];
    let r = 0;
    for (let i = 0; i < 4; i++) {
      const sel = (c >>> (4 * i)) & 0xf;
      let v = bytes[sel & 7] as number;
      if (sel & 8) v = v & 0x80 ? 0xff : 0;
      r |= v << (8 * i);
    }
    return r >>> 0;
  },
  shift64(op: "shl" | "shr", type: string, a: number | bigint, b: number): number | bigint {
    const n = BigInt(Math.min(b, 64));
    let x = type === "s64" ? BigInt.asIntN(64, BigInt(a)) : BigInt.asUintN(64, BigInt(a));
    x = op === "shl" ? BigInt.asUintN(64, x << n) : x >> n;
    const u = BigInt.asUintN(64, x);
    return u <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(u) : u;
  },
  bit64(op: string, a: number | bigint, b: number | bigint): number | bigint {
    const x = BigInt.asUintN(64, BigInt(a));
    const y = BigInt.asUintN(64, BigInt(b));
    const r = op === "&" ? x & y : op === "|" ? x | y : x ^ y;
    return r <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(r) : r;
  },
};

/** Typed views over one buffer. */
interface Views {
  readonly u8: Uint8Array;
  readonly i8: Int8Array;
  readonly u16: Uint16Array;
  readonly i16: Int16Array;
  readonly u32: Uint32Array;
  readonly i32: Int32Array;
  readonly f32: Float32Array;
  readonly f64: Float64Array;
}

function views(buf: ArrayBuffer): Views {
  return {
    u8: new Uint8Array(buf),
    i8: new Int8Array(buf),
    u16: new Uint16Array(buf),
    i16: new Int16Array(buf),
    u32: new Uint32Array(buf),
    i32: new Int32Array(buf),
    f32: new Float32Array(buf),
    f64: new Float64Array(buf),
  };
}

/** Per-thread state the generated code reads (special registers, parameters) and the mailbox of a collective. */
interface ThreadState {
  tidx: number;
  tidy: number;
  tidz: number;
  ntidx: number;
  ntidy: number;
  ntidz: number;
  ctaidx: number;
  ctaidy: number;
  ctaidz: number;
  nctaidx: number;
  nctaidy: number;
  nctaidz: number;
  lane: number;
  warp: number;
  params: Record<string, number>;
  S: Views & { bytes: number };
  /** Check a shared access (mode 0 read, 1 write, 2 atomic) and return its index. */
  sharedIndex: (a: number, bytes: number, site: number, mode: number) => number;
  site: number;
  a: number;
  b: number;
  c: number;
  mask: number;
  r: number;
  p: boolean;
  v: number[];
  na: number;
  nb: number;
  out: number[];
}

/** A kernel made runnable on one machine: its generator factory bound to the machine's helpers. */
export interface LoadedKernel {
  readonly kernel: CompiledKernel;
  readonly run: (T: unknown) => Generator<number, void, unknown>;
  readonly lo: Float64Array;
  readonly hi: Float64Array;
  /** Dynamic shared memory allowed past 48 KiB (cuFuncSetAttribute). */
  maxDynamicShared: number;
}

/** Launch geometry and arguments. */
export interface LaunchSpec {
  readonly grid: readonly [number, number, number];
  readonly block: readonly [number, number, number];
  readonly sharedBytes: number;
  /** Parameter values in `.param` order (addresses as numbers). */
  readonly args: readonly number[];
}

/** Limits of the simulated device. */
export interface MachineLimits {
  readonly memoryBytes: number;
  /** Opt-in shared memory per block (bytes). */
  readonly maxSharedOptin: number;
}

const ALIGN = 256;

/**
 * The simulated device: memory and launches.
 */
export class SimMachine {
  readonly memory: ArrayBuffer;
  readonly views: Views;
  readonly limits: MachineLimits;
  /** Live allocations, sorted by start (offsets into the arena). */
  readonly #regions: Region[] = [];
  /** Free extents (offset, bytes), sorted. */
  readonly #free: { start: number; bytes: number }[];
  #used = 0;
  /** Instructions retired by the last launch (all threads), for the curious. */
  lastInstructions = 0;

  constructor(limits: MachineLimits) {
    if (limits.memoryBytes > 2 ** 32 || limits.memoryBytes < ALIGN)
      throw new TpError(
        "E_ARG",
        `PTX simulator: memory ${limits.memoryBytes} B must be within 256 B .. 4 GiB`,
      );
    this.limits = limits;
    this.memory = new ArrayBuffer(limits.memoryBytes);
    this.views = views(this.memory);
    this.#free = [{ start: 0, bytes: limits.memoryBytes }];
  }

  get usedBytes(): number {
    return this.#used;
  }

  /**
   * Give the arena back to the host now (detach it: its pages go at the next collection, even where
   * something still references this machine). The machine is unusable after.
   */
  release(): void {
    const buf = this.memory as ArrayBuffer & { detached?: boolean; transfer?: (n: number) => ArrayBuffer };
    if (buf.detached !== true && typeof buf.transfer === "function") buf.transfer(0);
    this.#regions.length = 0;
  }

  /** Allocate `bytes` (aligned to 256), filled with 0xff. @returns the device address @throws TpError E_OOM */
  alloc(bytes: number): number {
    if (!Number.isInteger(bytes) || bytes <= 0)
      throw new TpError("E_ARG", `PTX simulator: cannot allocate ${bytes} B`);
    const need = Math.ceil(bytes / ALIGN) * ALIGN;
    const i = this.#free.findIndex((f) => f.bytes >= need);
    if (i < 0) {
      throw new TpError(
        "E_OOM",
        `PTX simulator: out of memory allocating ${bytes} B (${this.#used} of ${this.limits.memoryBytes} B in use)`,
      );
    }
    const f = this.#free[i] as { start: number; bytes: number };
    const start = f.start;
    if (f.bytes === need) this.#free.splice(i, 1);
    else {
      f.start += need;
      f.bytes -= need;
    }
    const r: Region = { start, bytes };
    const at = this.#regions.findIndex((x) => x.start > start);
    this.#regions.splice(at < 0 ? this.#regions.length : at, 0, r);
    this.#used += need;
    this.views.u8.fill(0xff, start, start + bytes);
    return BASE_ADDRESS + start;
  }

  /** Free an allocation by its address. @throws TpError E_ARG for an address that is not one */
  free(address: number): void {
    const start = address - BASE_ADDRESS;
    const i = this.#regions.findIndex((r) => r.start === start);
    if (i < 0) throw new TpError("E_ARG", `PTX simulator: ${address.toString(16)} is not an allocation`);
    const r = this.#regions[i] as Region;
    this.#regions.splice(i, 1);
    const need = Math.ceil(r.bytes / ALIGN) * ALIGN;
    this.#used -= need;
    const ext = { start: r.start, bytes: need };
    const j = this.#free.findIndex((f) => f.start > ext.start);
    this.#free.splice(j < 0 ? this.#free.length : j, 0, ext);
    // Merge neighbours.
    for (let k = this.#free.length - 1; k > 0; k--) {
      const a = this.#free[k - 1] as { start: number; bytes: number };
      const b = this.#free[k] as { start: number; bytes: number };
      if (a.start + a.bytes === b.start) {
        a.bytes += b.bytes;
        this.#free.splice(k, 1);
      }
    }
  }

  /** The region holding [start, start + bytes) or null. */
  region(start: number, bytes: number): Region | null {
    let lo = 0;
    let hi = this.#regions.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      const r = this.#regions[mid] as Region;
      if (start < r.start) hi = mid - 1;
      else if (start >= r.start + r.bytes) lo = mid + 1;
      else return start + bytes <= r.start + r.bytes ? r : null;
    }
    return null;
  }

  /** The arena offset of a checked host-side access (copies, memset). @throws TpError E_ARG */
  checkedOffset(address: number, bytes: number, what: string): number {
    const start = address - BASE_ADDRESS;
    if (bytes === 0) return start;
    if (this.region(start, bytes) === null)
      throw new TpError(
        "E_ARG",
        `PTX simulator: ${what} of ${bytes} B at 0x${address.toString(16)} is outside every allocation`,
      );
    return start;
  }

  /** Bind a compiled kernel to this machine. */
  load(kernel: CompiledKernel): LoadedKernel {
    const lo = new Float64Array(kernel.memSites.length);
    const hi = new Float64Array(kernel.memSites.length);
    const M = {
      ...HELPERS,
      ...this.views,
      lo,
      hi,
      index: (a: number, bytes: number, site: number): number => {
        const s = kernel.memSites[site];
        const where = `kernel ${kernel.name}, line ${s?.line}: ${s?.text}`;
        if (typeof a !== "number" || !Number.isFinite(a))
          throw new TpError("E_INTERNAL", `PTX simulator: ${where}: address ${String(a)} is not a number`);
        if (a % bytes !== 0 && bytes <= 16 && (a & (bytes - 1)) !== 0)
          throw new TpError(
            "E_INTERNAL",
            `PTX simulator: ${where}: misaligned ${bytes}-byte access at 0x${a.toString(16)}`,
          );
        const start = a - BASE_ADDRESS;
        const r = this.region(start, bytes);
        if (r === null) {
          const near = this.#regions.find((x) => start >= x.start && start < x.start + x.bytes + 4096);
          const detail =
            near === undefined
              ? "outside every allocation"
              : `${start + bytes - (near.start + near.bytes)} B past the end of an allocation of ${near.bytes} B`;
          throw new TpError(
            "E_INTERNAL",
            `PTX simulator: ${where}: ${bytes}-byte access at 0x${a.toString(16)} is ${detail}`,
          );
        }
        lo[site] = BASE_ADDRESS + r.start;
        hi[site] = BASE_ADDRESS + r.start + r.bytes;
        return start;
      },
    };
    return { kernel, run: kernel.factory(M), lo, hi, maxDynamicShared: 48 * 1024 };
  }

  /**
   * Run a kernel to completion.
   * @throws TpError E_UNSUPPORTED for a block past `.maxntid` or 1024 threads, or shared memory past the
   *   limit; E_INTERNAL for a fault (out-of-bounds or misaligned access, a deadlock, a collective with an
   *   exited or absent lane), naming the kernel and the instruction
   */
  launch(k: LoadedKernel, spec: LaunchSpec): void {
    const kernel = k.kernel;
    const [bx, by, bz] = spec.block;
    const threads = bx * by * bz;
    const name = kernel.name;
    if (threads < 1 || threads > 1024)
      throw new TpError(
        "E_UNSUPPORTED",
        `PTX simulator: kernel ${name}: block ${spec.block.join("×")} is past 1024 threads`,
      );
    const mx = kernel.maxntid;
    if (mx !== null && (bx > mx[0] || by > mx[1] || bz > mx[2]))
      throw new TpError(
        "E_UNSUPPORTED",
        `PTX simulator: kernel ${name}: block ${spec.block.join("×")} is past its .maxntid ${mx.join(", ")}`,
      );
    const dyn = spec.sharedBytes;
    if (dyn > 48 * 1024 && dyn > k.maxDynamicShared)
      throw new TpError(
        "E_UNSUPPORTED",
        `PTX simulator: kernel ${name}: ${dyn} B of dynamic shared memory needs cuFuncSetAttribute`,
      );
    const sharedTotal =
      kernel.staticShared +
      (dyn > 0 ? Math.ceil(kernel.staticShared / 16) * 16 - kernel.staticShared + dyn : 0);
    if (sharedTotal > this.limits.maxSharedOptin || kernel.staticShared > 48 * 1024)
      throw new TpError(
        "E_UNSUPPORTED",
        `PTX simulator: kernel ${name}: ${sharedTotal} B of shared memory is past the device's limit`,
      );
    if (spec.args.length !== kernel.params.length)
      throw new TpError(
        "E_INTERNAL",
        `PTX simulator: kernel ${name}: ${spec.args.length} arguments for ${kernel.params.length} parameters`,
      );
    const params: Record<string, number> = {};
    kernel.params.forEach((p, i) => {
      const v = spec.args[i] as number;
      params[p.name] = p.type === "f32" ? Math.fround(v) : v;
    });
    k.lo.fill(0);
    k.hi.fill(0);
    const [gx, gy, gz] = spec.grid;
    const sharedBuf = new ArrayBuffer(Math.max(16, Math.ceil(sharedTotal / 16) * 16));
    const S = Object.assign(views(sharedBuf), { bytes: sharedTotal });
    // Race check, per 4-byte word of shared memory: the last writer and reader (−2: several) and the
    // barrier epoch of each; a read of a word another thread wrote, or a write of a word another
    // thread read or wrote, in the same epoch (no bar.sync between) is a race. Sub-word accesses are not
    // checked (a word may hold several threads' bytes), nor atomics.
    const words = Math.ceil(sharedTotal / 4);
    const race = {
      epoch: 0,
      writer: new Int32Array(words),
      writeEpoch: new Int32Array(words),
      writeSite: new Int32Array(words),
      reader: new Int32Array(words),
      readEpoch: new Int32Array(words),
      readSite: new Int32Array(words),
    };
    const siteText = (s: number) => {
      const m = kernel.memSites[s];
      return `line ${m?.line} (${m?.text})`;
    };
    const sharedAccess = (a: number, bytes: number, site: number, mode: number, tid: number): number => {
      if (a < 0 || a + bytes > sharedTotal || (a & (bytes - 1)) !== 0) {
        const s = kernel.memSites[site];
        throw new TpError(
          "E_INTERNAL",
          `PTX simulator: kernel ${name}, line ${s?.line}: ${s?.text}: ${bytes}-byte shared access at ${a} is ${(a & (bytes - 1)) !== 0 ? "misaligned" : `outside the block's ${sharedTotal} B`}`,
        );
      }
      if (mode === 2 || bytes < 4) return a;
      const e = race.epoch;
      for (let w = a >> 2; w < (a + bytes) >> 2; w++) {
        const writer = race.writer[w] as number;
        const wrote = race.writeEpoch[w] === e && writer !== tid && writer >= 0;
        if (mode === 0) {
          if (wrote)
            throw new TpError(
              "E_INTERNAL",
              `PTX simulator: kernel ${name}: shared-memory race at byte ${w * 4}: thread ${tid} reads it at ${siteText(site)} after thread ${writer} wrote it at ${siteText(race.writeSite[w] as number)} with no bar.sync between`,
            );
          if (race.readEpoch[w] === e && race.reader[w] !== tid) race.reader[w] = -2;
          else {
            race.reader[w] = tid;
            race.readEpoch[w] = e;
          }
          race.readSite[w] = site;
        } else {
          const reader = race.reader[w] as number;
          if (wrote || (race.readEpoch[w] === e && reader !== tid && reader !== -1)) {
            const other = wrote
              ? `thread ${writer} wrote it at ${siteText(race.writeSite[w] as number)}`
              : `${reader === -2 ? "other threads" : `thread ${reader}`} read it at ${siteText(race.readSite[w] as number)}`;
            throw new TpError(
              "E_INTERNAL",
              `PTX simulator: kernel ${name}: shared-memory race at byte ${w * 4}: thread ${tid} writes it at ${siteText(site)} after ${other} with no bar.sync between`,
            );
          }
          race.writer[w] = tid;
          race.writeEpoch[w] = e;
          race.writeSite[w] = site;
        }
      }
      return a;
    };
    const states: ThreadState[] = [];
    for (let t = 0; t < threads; t++) {
      states.push({
        tidx: t % bx,
        tidy: Math.floor(t / bx) % by,
        tidz: Math.floor(t / (bx * by)),
        ntidx: bx,
        ntidy: by,
        ntidz: bz,
        ctaidx: 0,
        ctaidy: 0,
        ctaidz: 0,
        nctaidx: gx,
        nctaidy: gy,
        nctaidz: gz,
        lane: t & 31,
        warp: t >> 5,
        params,
        S,
        sharedIndex: (a: number, bytes: number, site: number, mode: number) =>
          sharedAccess(a, bytes, site, mode, t),
        site: -1,
        a: 0,
        b: 0,
        c: 0,
        mask: 0,
        r: 0,
        p: false,
        v: [],
        na: 0,
        nb: 0,
        out: [],
      });
    }
    for (let z = 0; z < gz; z++)
      for (let y = 0; y < gy; y++)
        for (let x = 0; x < gx; x++) {
          S.u8.fill(0xff);
          race.epoch = 0;
          race.writer.fill(-1);
          race.reader.fill(-1);
          race.writeEpoch.fill(-1);
          race.readEpoch.fill(-1);
          for (const st of states) {
            st.ctaidx = x;
            st.ctaidy = y;
            st.ctaidz = z;
          }
          this.#runBlock(k, states, () => {
            race.epoch++;
          });
        }
  }

  #runBlock(k: LoadedKernel, states: ThreadState[], onBarrier: () => void): void {
    const kernel = k.kernel;
    const n = states.length;
    const gens = states.map((s) => k.run(s));
    // 0 running, 1 waiting at a collective, 2 exited
    const status = new Uint8Array(n);
    const step = (i: number): void => {
      const r = (gens[i] as Generator<number, void, unknown>).next();
      status[i] = r.done === true ? 2 : 1;
    };
    for (let i = 0; i < n; i++) step(i);
    const warps = Math.ceil(n / 32);
    for (;;) {
      let waiting = 0;
      for (let i = 0; i < n; i++) if (status[i] === 1) waiting++;
      if (waiting === 0) return;
      let progressed = false;
      for (let w = 0; w < warps; w++) {
        const base = w * 32;
        const end = Math.min(base + 32, n);
        // Lanes waiting at a warp collective, grouped by site.
        const bySite = new Map<number, number[]>();
        for (let i = base; i < end; i++) {
          if (status[i] !== 1) continue;
          const s = (states[i] as ThreadState).site;
          if (kernel.sites[s]?.kind === "bar") continue;
          const list = bySite.get(s);
          if (list === undefined) bySite.set(s, [i]);
          else list.push(i);
        }
        for (const [s, lanes] of bySite) {
          const site = kernel.sites[s];
          if (site === undefined) continue;
          const where = `kernel ${kernel.name}, line ${site.line}: ${site.text}`;
          let mask: number;
          if (site.kind === "shfl" || site.kind === "vote") {
            mask = (states[lanes[0] as number] as ThreadState).mask >>> 0;
            for (const i of lanes) {
              if ((states[i] as ThreadState).mask >>> 0 !== mask)
                throw new TpError(
                  "E_INTERNAL",
                  `PTX simulator: ${where}: lanes of warp ${w} disagree on the member mask`,
                );
            }
          } else mask = 0xffffffff;
          // Every lane of the mask must be here; an exited one is a fault, one elsewhere may still come.
          let ready = true;
          for (let l = 0; l < 32; l++) {
            if (((mask >>> l) & 1) === 0) continue;
            const i = base + l;
            if (i >= end)
              throw new TpError(
                "E_INTERNAL",
                `PTX simulator: ${where}: lane ${l} of the member mask does not exist (block of ${n} threads)`,
              );
            if (status[i] === 2)
              throw new TpError(
                "E_INTERNAL",
                `PTX simulator: ${where}: lane ${l} of the member mask has exited`,
              );
            if (status[i] !== 1 || (states[i] as ThreadState).site !== s) ready = false;
          }
          for (const i of lanes) {
            if (((mask >>> (i - base)) & 1) === 0)
              throw new TpError(
                "E_INTERNAL",
                `PTX simulator: ${where}: lane ${i - base} runs it outside its own member mask`,
              );
          }
          if (!ready) continue;
          this.#resolve(site.kind, site.opcode, where, states, base, mask);
          for (const i of lanes) step(i);
          progressed = true;
        }
      }
      if (progressed) continue;
      // No warp collective can complete: a barrier must, or nothing can.
      let atBar = 0;
      for (let i = 0; i < n; i++)
        if (status[i] === 1 && kernel.sites[(states[i] as ThreadState).site]?.kind === "bar") atBar++;
      if (atBar === waiting) {
        onBarrier();
        for (let i = 0; i < n; i++) if (status[i] === 1) step(i);
        continue;
      }
      const where = new Map<string, number>();
      for (let i = 0; i < n; i++) {
        if (status[i] !== 1) continue;
        const s = kernel.sites[(states[i] as ThreadState).site];
        const key = `line ${s?.line} (${s?.text})`;
        where.set(key, (where.get(key) ?? 0) + 1);
      }
      throw new TpError(
        "E_INTERNAL",
        `PTX simulator: kernel ${kernel.name} deadlocks: ${[...where].map(([k2, c]) => `${c} threads wait at ${k2}`).join("; ")}`,
      );
    }
  }

  #resolve(
    kind: string,
    opcode: readonly string[],
    where: string,
    states: ThreadState[],
    base: number,
    mask: number,
  ): void {
    const lane = (l: number) => states[base + l] as ThreadState;
    if (kind === "shfl") {
      const mode = opcode.find((m) => m === "up" || m === "down" || m === "bfly" || m === "idx");
      for (let l = 0; l < 32; l++) {
        if (((mask >>> l) & 1) === 0) continue;
        const t = lane(l);
        const bval = t.b & 31;
        const cval = t.c & 31;
        const segmask = (t.c >>> 8) & 31;
        const maxLane = (l & segmask) | (cval & ~segmask);
        const minLane = l & segmask;
        let j: number;
        let pval: boolean;
        if (mode === "up") {
          j = l - bval;
          pval = j >= maxLane;
        } else if (mode === "down") {
          j = l + bval;
          pval = j <= maxLane;
        } else if (mode === "bfly") {
          j = l ^ bval;
          pval = j <= maxLane;
        } else {
          j = minLane | (bval & ~segmask);
          pval = j <= maxLane;
        }
        if (!pval) j = l;
        if (((mask >>> j) & 1) === 0)
          throw new TpError(
            "E_INTERNAL",
            `PTX simulator: ${where}: lane ${l} reads lane ${j}, outside the member mask`,
          );
        t.r = lane(j).a >>> 0;
        t.p = pval;
      }
      return;
    }
    if (kind === "vote") {
      let ballot = 0;
      for (let l = 0; l < 32; l++) if ((mask >>> l) & 1 && lane(l).a) ballot |= 1 << l;
      ballot >>>= 0;
      const mode = opcode.find((m) => m === "ballot" || m === "any" || m === "all");
      for (let l = 0; l < 32; l++) {
        if (((mask >>> l) & 1) === 0) continue;
        const t = lane(l);
        t.r = ballot;
        t.p = mode === "any" ? ballot !== 0 : ballot === mask;
      }
      return;
    }
    if (kind === "mma") {
      mma(opcode, where, (l) => lane(l));
      return;
    }
    if (kind === "ldmatrix") {
      ldmatrix(opcode, where, (l) => lane(l));
      return;
    }
    throw new TpError("E_INTERNAL", `PTX simulator: ${where}: no resolver for ${kind}`);
  }
}

/** Element decoders of the mma input types: bits → value, and elements per 32-bit register. */
const MMA_TYPES: Record<string, { bits: number; decode: (x: number) => number }> = {
  f16: { bits: 16, decode: numeric.fromHalf },
  bf16: { bits: 16, decode: numeric.fromBfloat },
  tf32: { bits: 32, decode: (x) => numeric.bitsFloat(x & 0xffffe000) },
  s8: { bits: 8, decode: (x) => (x << 24) >> 24 },
  u8: { bits: 8, decode: (x) => x },
  s4: { bits: 4, decode: (x) => (x << 28) >> 28 },
  u4: { bits: 4, decode: (x) => x },
  e4m3: { bits: 8, decode: numeric.fromE4m3 },
  e5m2: { bits: 8, decode: numeric.fromE5m2 },
};

/**
 * mma.sync.aligned.m16n8kK.row.col: D[16×8] = A[16×K] · B[K×8] + C. Fragments (PTX ISA §9.7.14.5):
 * g = lane >> 2, t = lane % 4, e = elements per 32-bit register; A register r holds row g + 8·(r % 2),
 * columns e·t + (K/2)·⌊r/2⌋ + i; B register r holds rows e·t + (K/2)·r + i of column g; C / D element
 * j holds row g + 8·⌊j/2⌋, column 2t + j % 2. Floating products are summed in f64 and rounded once to f32.
 */
function mma(opcode: readonly string[], where: string, lane: (l: number) => ThreadState): void {
  const shape = opcode.find((p) => /^m\d+n\d+k\d+$/.test(p));
  const m = /^m16n8k(\d+)$/.exec(shape ?? "");
  if (m === null || !opcode.includes("row") || !opcode.includes("col"))
    throw new TpError("E_UNSUPPORTED", `PTX simulator: ${where}: only mma.sync m16n8kK.row.col is simulated`);
  const K = Number(m[1]);
  const i = opcode.indexOf("col");
  const [dType, aType, bType] = [opcode[i + 1], opcode[i + 2], opcode[i + 3]] as [string, string, string];
  const at = MMA_TYPES[aType];
  const bt = MMA_TYPES[bType];
  if (at === undefined || bt === undefined)
    throw new TpError(
      "E_UNSUPPORTED",
      `PTX simulator: ${where}: mma input type ${aType} / ${bType} is not simulated`,
    );
  const epr = 32 / at.bits;
  const nA = (16 * K) / 32 / epr;
  const nB = (K * 8) / 32 / epr;
  const A = new Float64Array(16 * K);
  const B = new Float64Array(K * 8);
  const C = new Float64Array(16 * 8);
  const unpack = (word: number, bits: number, idx: number) =>
    bits === 32 ? word >>> 0 : (word >>> (bits * idx)) & ((1 << bits) - 1);
  for (let l = 0; l < 32; l++) {
    const t = lane(l);
    if (t.na !== nA || t.nb !== nB)
      throw new TpError(
        "E_INTERNAL",
        `PTX simulator: ${where}: ${t.na} A / ${t.nb} B registers for m16n8k${K} (${nA} / ${nB} expected)`,
      );
    const g = l >> 2;
    const q = l & 3;
    for (let r = 0; r < nA; r++) {
      const word = t.v[r] as number;
      for (let e = 0; e < epr; e++) {
        const row = g + 8 * (r % 2);
        const col = epr * q + (K / 2) * Math.floor(r / 2) + e;
        A[row * K + col] = at.decode(unpack(word, at.bits, e));
      }
    }
    for (let r = 0; r < nB; r++) {
      const word = t.v[nA + r] as number;
      for (let e = 0; e < epr; e++) {
        const k = epr * q + (K / 2) * r + e;
        B[k * 8 + g] = bt.decode(unpack(word, bt.bits, e));
      }
    }
    for (let j = 0; j < 4; j++) C[(g + 8 * (j >> 1)) * 8 + 2 * q + (j & 1)] = t.v[nA + nB + j] as number;
  }
  const integer = dType === "s32";
  for (let l = 0; l < 32; l++) {
    const t = lane(l);
    const g = l >> 2;
    const q = l & 3;
    const out: number[] = [];
    for (let j = 0; j < 4; j++) {
      const row = g + 8 * (j >> 1);
      const col = 2 * q + (j & 1);
      let s = 0;
      for (let k = 0; k < K; k++) s += (A[row * K + k] as number) * (B[k * 8 + col] as number);
      const c = C[row * 8 + col] as number;
      out.push(integer ? (c + s) | 0 : Math.fround(c + s));
    }
    t.out = out;
  }
}

/**
 * ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16: lanes 8j … 8j + 7 give the row addresses of
 * matrix j; register j of lane l holds row ⌊l/4⌋, columns 2·(l % 4) and +1 of matrix j (with .trans,
 * column ⌊l/4⌋ of rows 2·(l % 4) and +1), the lower column in the lower half.
 */
function ldmatrix(opcode: readonly string[], where: string, lane: (l: number) => ThreadState): void {
  const x = opcode.find((p) => /^x[124]$/.test(p)) ?? "x1";
  const count = Number(x.slice(1));
  const trans = opcode.includes("trans");
  const S = lane(0).S;
  const rowAddr = (j: number, r: number): number => {
    const a = lane(8 * j + r).a;
    if (a < 0 || a + 16 > S.bytes || (a & 15) !== 0)
      throw new TpError(
        "E_INTERNAL",
        `PTX simulator: ${where}: row address ${a} of matrix ${j} is misaligned or outside shared memory`,
      );
    return a;
  };
  const el = (j: number, r: number, c: number): number => S.u16[(rowAddr(j, r) + 2 * c) >>> 1] as number;
  for (let l = 0; l < 32; l++) {
    const out: number[] = [];
    const r = l >> 2;
    const c = 2 * (l & 3);
    for (let j = 0; j < count; j++) {
      const lo = trans ? el(j, c, r) : el(j, r, c);
      const hi = trans ? el(j, c + 1, r) : el(j, r, c + 1);
      out.push((lo | (hi << 16)) >>> 0);
    }
    lane(l).out = out;
  }
}
