import { loadBackend, Weight } from "@tp/tensor";
const K = 257, N = 1;
const codes = new Uint8Array(N * K);
let s = 7;
for (let i = 0; i < codes.length; i++) { s = (s * 1103515245 + 12345) >>> 0; let c = (s >>> 16) & 0xff; if ((c & 127) === 127) c = 0; codes[i] = c; }
const cpu = await loadBackend("cpu", {});
const b = await loadBackend("ptx", { simulate: "sm_86" } as any);
const w = new Weight({ name: "w", format: "f8_e4m3fn", shape: [N, K], data: codes } as any);
let n = 0;
for (let kk = 0; kk < K; kk++) {
  const x = new Float32Array(K); x[kk] = 1;
  const y = (await b.read(b.matmul(b.upload(x, [1, K], "f32", "x"), w))) as Float32Array;
  const z = (await cpu.read(cpu.matmul(cpu.upload(x, [1, K], "f32", "x"), w))) as Float32Array;
  if (y[0] !== z[0] && n++ < 10) console.log(kk, codes[kk]!.toString(16), y[0], z[0]);
}
console.log("diffs", n);
const t = b.upload(codes, [K], "u8", "c");
const back = (await b.read(t)) as Uint8Array;
console.log("readback 250..257", Array.from(back.slice(250, 257)).map((v) => v.toString(16)).join(" "), "orig", Array.from(codes.slice(250, 257)).map((v) => v.toString(16)).join(" "));
