import { loadBackend, Weight } from "@tp/tensor";
const [M, K, N] = process.argv.slice(2).map(Number) as [number, number, number];
const codes = new Uint8Array(N * K);
let s = 7;
for (let i = 0; i < codes.length; i++) { s = (s * 1103515245 + 12345) >>> 0; let c = (s >>> 16) & 0xff; if ((c & 127) === 127) c = 0; codes[i] = c; }
const x = new Float32Array(M * K);
for (let i = 0; i < x.length; i++) x[i] = ((i * 7919) % 13) - 6;
const outs: Float32Array[] = [];
for (const name of ["cpu", "ptx"]) {
  const b = await loadBackend(name, name === "ptx" ? ({ simulate: "sm_86" } as any) : {});
  const w = new Weight({ name: "w", format: "f8_e4m3fn", shape: [N, K], data: codes } as any);
  const xt = b.upload(x, [M, K], "f32", "x");
  outs.push((await b.read(b.matmul(xt, w))) as Float32Array);
}
let bad = 0;
for (let i = 0; i < outs[0]!.length; i++) if (Math.abs(outs[0]![i]! - outs[1]![i]!) > 1e-3 * Math.max(1, Math.abs(outs[0]![i]!))) { if (bad++ < 5) console.log(i, outs[0]![i], outs[1]![i]); }
console.log("bad", bad, "of", outs[0]!.length);
