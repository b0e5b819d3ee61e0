import { loadBackend, Weight } from "@tp/tensor";
const K = 64, N = 3;
const codes = new Uint8Array(N * K);
for (let i = 0; i < codes.length; i++) codes[i] = (i * 37 + 11) % 256 === 127 || (i * 37 + 11) % 256 === 255 ? 0 : (i * 37 + 11) % 256;
const x = new Float32Array(K); x.fill(0); 
for (const kk of [0, 1, 5, 33]) {
  x.fill(0); x[kk] = 1;
  const res: string[] = [];
  for (const name of ["cpu", "ptx"]) {
    const b = await loadBackend(name, name === "ptx" ? ({ simulate: "sm_86" } as any) : {});
    const w = new Weight({ name: "w", format: "f8_e4m3fn", shape: [N, K], data: codes } as any);
    const xt = b.upload(x, [1, K], "f32", "x");
    const y = await b.read(b.matmul(xt, w));
    res.push(`${name}: ${Array.from(y as Float32Array).join(",")}`);
  }
  console.log(kk, res.join(" | "));
}
