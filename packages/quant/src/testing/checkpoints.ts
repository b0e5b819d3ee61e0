/**
 * TEST-ONLY: small synthetic float checkpoints shaped like a Krea 2 DiT (so layout detection picks
 * the default quantized layers), written with @tp/formats into temporary folders.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SafetensorsTensorInput, writeSafetensors } from "@tp/formats";
import { f32ToBf16 } from "@tp/tensor";
import { gaussian } from "./fixtures.ts";

/** A fresh temporary folder and its removal. */
export function tempFolder(tag: string): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), `tp-quant-${tag}-`));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/** Seeded normal values as BF16 bytes. */
export function bf16Bytes(n: number, seed: number, sigma = 0.05): Uint8Array {
  const x = gaussian(seed, n, sigma);
  const out = new Uint16Array(n);
  for (let i = 0; i < n; i++) out[i] = f32ToBf16(x[i] as number);
  return new Uint8Array(out.buffer);
}

/** The 8 quantized linears of a Krea 2 block: name, N, K (dim d, SwiGLU hidden h). */
export function krea2Linears(d: number, h: number): [string, number, number][] {
  return [
    ["attn.wq", d, d],
    ["attn.wk", d, d],
    ["attn.wv", d, d],
    ["attn.gate", d, d],
    ["attn.wo", d, d],
    ["mlp.gate", h, d],
    ["mlp.up", h, d],
    ["mlp.down", d, h],
  ];
}

/**
 * Write a BF16 checkpoint with the Krea 2 DiT names: `first`, `txtfusion.projector`, and `blocks`
 * blocks of `mod.lin`, a norm and the 8 linears (dim `d`, hidden `h`). Returns the path.
 */
export function writeTinyKrea2(
  path: string,
  options: { d?: number; h?: number; blocks?: number; seed?: number; metadata?: Record<string, string> } = {},
): string {
  const d = options.d ?? 256;
  const h = options.h ?? 512;
  let seed = options.seed ?? 1;
  const T = (name: string, shape: number[]): SafetensorsTensorInput => ({
    name,
    dtype: "BF16",
    shape,
    data: bf16Bytes(
      shape.reduce((a, b) => a * b, 1),
      seed++,
    ),
  });
  const tensors = [T("first.weight", [d, 64]), T("txtfusion.projector.weight", [1, 12])];
  for (let b = 0; b < (options.blocks ?? 1); b++) {
    tensors.push(T(`blocks.${b}.mod.lin`, [6 * d]), T(`blocks.${b}.prenorm.scale`, [d]));
    for (const [l, n, k] of krea2Linears(d, h)) tensors.push(T(`blocks.${b}.${l}.weight`, [n, k]));
  }
  writeSafetensors(path, tensors, options.metadata ? { metadata: options.metadata } : {});
  return path;
}
