import { loadBackend, Weight } from "@tp/tensor";
const K = 300, N = 1;
const codes = new Uint8Array(N * K);
for (let i = 0; i < K; i++) codes[i] = 0x2c;
const b = await loadBackend("ptx", { simulate: "sm_86" } as any);
const w = new Weight({ name: "w", format: "f8_e4m3fn", shape: [N, K], data: codes } as any);
const res: string[] = [];
for (const kk of [0, 7, 100, 255, 256, 257, 263, 299]) {
  const x = new Float32Array(K); x[kk] = 1;
  const y = (await b.read(b.matmul(b.upload(x, [1, K], "f32", "x"), w))) as Float32Array;
  res.push(`${kk}:${y[0]} (want 0.375)`);
}
console.log(res.join("  "));
