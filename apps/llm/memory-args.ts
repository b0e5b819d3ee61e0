/**
 * The memory flags of `bun apps/llm` (issue 26): layer placement as llama.cpp users know it (`-ngl`,
 * `--cpu-moe`, `--n-cpu-moe`), the original project's `--cpu-layers tail|attn`, and the budgets
 * `--vram-budget` (the device backend's account; without -ngl it chooses -ngl) and `--ram-budget` (the
 * cpu backend's account: activations, KV, norm scales — not the memory-mapped weights, which are page
 * cache). Every bad value is one TpError E_ARG naming the flag. Placement: @tp/llm placement.ts.
 */
import type { CpuLayerPolicy } from "@tp/llm";
import { parseByteSize, parseVramBudget, TpError, type VramBudget } from "@tp/tensor";

/** The checked memory flags. */
export interface MemoryArgs {
  /** `-ngl` / `--gpu-layers` / `--n-gpu-layers`: slots (blocks + head) on the device, or "all". */
  gpuLayers: number | "all" | undefined;
  cpuLayers: CpuLayerPolicy | undefined;
  cpuMoe: boolean;
  nCpuMoe: number | undefined;
  vramBudget: VramBudget | undefined;
  /** Bytes. */
  ramBudget: number | undefined;
}

/** parseArgs option specs of the memory flags (`-ngl` and `-ncmoe` are mapped by {@link memoryShortFlags}). */
export const MEMORY_OPTIONS = {
  "gpu-layers": { type: "string" },
  "n-gpu-layers": { type: "string" },
  "cpu-layers": { type: "string" },
  "cpu-moe": { type: "boolean", default: false },
  "n-cpu-moe": { type: "string" },
  "vram-budget": { type: "string" },
  "ram-budget": { type: "string" },
} as const;

/** Usage lines of the memory flags. */
export const MEMORY_USAGE = `  -ngl, --gpu-layers N    with a device --backend: the last N of the L+1 slots (the L layers,
                          then the output head) on the device, the rest on the cpu backend
                          (llama.cpp's count: 1 = the head only); all (or N >= L+1) = everything
                          (default: all, or what --vram-budget holds)
  --cpu-layers tail|attn  which layers go to the cpu first: tail = the last layers (the head and a
                          device prefix stay), attn = the layers with KV first (Qwen 3.5: 1/4 of them)
  --cpu-moe               MoE: every layer's experts on the cpu (attention, router, shared expert
                          and head stay on the device)
  --n-cpu-moe N           MoE: the experts of the first N layers on the cpu
  --vram-budget N|min     bytes the device backend may hold (512MiB, 2G, ...); without -ngl it
                          picks the most layers that fit (resident weights + KV at --ctx +
                          state + a dry step's working peak); min = nothing on the device
  --ram-budget N          bytes the cpu backend may hold (activations, KV; the memory-mapped
                          weights are page cache and reported apart)`;

/**
 * `-ngl N` / `-ngl=N` → `--gpu-layers`, `-ncmoe` → `--n-cpu-moe` (llama.cpp's multi-letter short
 * flags, which node's parseArgs cannot declare); other arguments unchanged.
 */
export function memoryShortFlags(a: string): string {
  if (a === "-ngl") return "--gpu-layers";
  if (a.startsWith("-ngl=")) return `--gpu-layers=${a.slice(5)}`;
  if (a === "-ncmoe") return "--n-cpu-moe";
  if (a.startsWith("-ncmoe=")) return `--n-cpu-moe=${a.slice(7)}`;
  return a;
}

/** A whole number ≥ 0 (decimal digits only), else E_ARG naming the flag. */
function count(flag: string, v: string): number {
  const t = v.trim();
  const x = /^\+?\d+$/.test(t) ? Number(t) : Number.NaN;
  if (!Number.isSafeInteger(x)) throw new TpError("E_ARG", `${flag} must be a whole number ≥ 0, got '${v}'`);
  return x;
}

/**
 * Check the memory flags against each other and the backend.
 * @param s the raw string flags by long name; `cpuMoe` the boolean
 * @throws TpError E_ARG naming the flag: a bad count or size, `-ngl` twice under two names, placement
 *   flags with `--backend cpu`, `--cpu-layers` with nothing to place, `--cpu-moe` with `--n-cpu-moe`
 */
export function memoryArgs(
  s: (k: string) => string | undefined,
  cpuMoe: boolean,
  backend: string,
): MemoryArgs {
  const a = s("gpu-layers");
  const b = s("n-gpu-layers");
  if (a !== undefined && b !== undefined)
    throw new TpError("E_ARG", "-ngl/--gpu-layers and --n-gpu-layers are the same flag; give one");
  const nglText = a ?? b;
  const gpuLayers =
    nglText === undefined
      ? undefined
      : ["all", "auto"].includes(nglText.trim().toLowerCase())
        ? "all"
        : countOrAll(nglText);
  const policy = s("cpu-layers");
  if (policy !== undefined && policy !== "tail" && policy !== "attn")
    throw new TpError("E_ARG", `--cpu-layers must be tail or attn, got '${policy}'`);
  const n = s("n-cpu-moe");
  const nCpuMoe = n === undefined ? undefined : count("--n-cpu-moe", n);
  if (cpuMoe && nCpuMoe !== undefined)
    throw new TpError("E_ARG", "--cpu-moe (all experts on the cpu) and --n-cpu-moe N exclude each other");
  const vram = s("vram-budget");
  const vramBudget = vram === undefined ? undefined : parseVramBudget(vram, "--vram-budget");
  const ram = s("ram-budget");
  const ramBudget = ram === undefined ? undefined : parseByteSize(ram, "--ram-budget");
  const m: MemoryArgs = {
    gpuLayers,
    cpuLayers: policy as CpuLayerPolicy | undefined,
    cpuMoe,
    nCpuMoe,
    vramBudget,
    ramBudget,
  };
  if (placing(m) && backend === "cpu") {
    const flag =
      gpuLayers !== undefined
        ? "-ngl"
        : vramBudget !== undefined
          ? "--vram-budget"
          : cpuMoe
            ? "--cpu-moe"
            : "--n-cpu-moe";
    throw new TpError(
      "E_ARG",
      `${flag} places layers on a device backend; give --backend vulkan (with --backend cpu everything runs on the cpu)`,
    );
  }
  if (policy !== undefined && gpuLayers === undefined && vramBudget === undefined)
    throw new TpError(
      "E_ARG",
      "--cpu-layers chooses which layers -ngl or --vram-budget leave on the cpu; give one of them",
    );
  return m;
}

function countOrAll(v: string): number {
  const t = v.trim();
  if (!/^\+?\d+$/.test(t) || !Number.isSafeInteger(Number(t)))
    throw new TpError("E_ARG", `-ngl must be a whole number of layers ≥ 0 or all, got '${v}'`);
  return Number(t);
}

/** Whether the flags split the model between the device and the cpu backend. */
export function placing(m: MemoryArgs): boolean {
  return m.gpuLayers !== undefined || m.cpuMoe || m.nCpuMoe !== undefined || m.vramBudget !== undefined;
}
