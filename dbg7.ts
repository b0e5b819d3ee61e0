import { loadBackend, Weight } from "@tp/tensor";
import { SimCudaDriver } from "./packages/backend-ptx/src/sim/driver.ts";
const K = 257, N = 1;
const codes = new Uint8Array(N * K);
let s = 7;
for (let i = 0; i < codes.length; i++) { s = (s * 1103515245 + 12345) >>> 0; let c = (s >>> 16) & 0xff; if ((c & 127) === 127) c = 0; codes[i] = c; }
const b = await loadBackend("ptx", { simulate: "sm_86" } as any);
const w = new Weight({ name: "w", format: "f8_e4m3fn", shape: [N, K], data: codes } as any);
const x = new Float32Array(K); x[256] = 1;
const drv = (b as any).driver as SimCudaDriver;
const origLoad = drv.machine.load.bind(drv.machine);
(drv.machine as any).load = (k: any) => { if (k.name.includes("gemv")) console.log(k.source.split("\n").filter((l: string) => /R_?r1[0-4]\b|Rr10 =/.test(l)).slice(0, 14).join("\n")); return origLoad(k); };
const y = (await b.read(b.matmul(b.upload(x, [1, K], "f32", "x"), w))) as Float32Array;
console.log(y[0]);
