import { loadBackend, Weight } from "@tp/tensor";
const K = 257, N = 1;
const codes = new Uint8Array(N * K);
let s = 7;
for (let i = 0; i < codes.length; i++) { s = (s * 1103515245 + 12345) >>> 0; let c = (s >>> 16) & 0xff; if ((c & 127) === 127) c = 0; codes[i] = c; }
const b = await loadBackend("ptx", { simulate: "sm_86" } as any);
const w = new Weight({ name: "w", format: "f8_e4m3fn", shape: [N, K], data: codes } as any);
const x = new Float32Array(K); x[256] = 1;
const m = (b as any).driver.machine;
const orig = m.launch.bind(m);
m.launch = (k: any, spec: any) => { const wAddr = spec.args[2]; const off = wAddr - 2 ** 36; console.log(k.kernel.name, "w bytes 254..257:", Array.from(m.views.u8.slice(off + 254, off + 257)).map((v: number) => v.toString(16)).join(" "), "args", spec.args.map((a: number) => a.toString(16)).join(",")); return orig(k, spec); };
const y = (await b.read(b.matmul(b.upload(x, [1, K], "f32", "x"), w))) as Float32Array;
console.log(y[0], codes[256]!.toString(16));
