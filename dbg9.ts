import { loadBackend, Weight } from "@tp/tensor";
const K = 257, N = 1;
const codes = new Uint8Array(N * K);
let s = 7;
for (let i = 0; i < codes.length; i++) { s = (s * 1103515245 + 12345) >>> 0; let c = (s >>> 16) & 0xff; if ((c & 127) === 127) c = 0; codes[i] = c; }
const b = await loadBackend("ptx", { simulate: "sm_86" } as any);
const w = new Weight({ name: "w", format: "f8_e4m3fn", shape: [N, K], data: codes } as any);
const x = new Float32Array(K); x[256] = 1;
const m = (b as any).driver.machine;
const origLoad = m.load.bind(m);
m.load = (k: any) => {
  const src = k.source.replace("Rf0 = M.fround", "X").replace(/(fma\b|Rf0 = Math\.fround\(Rf3 \* Rf1 \+ Rf0\);)/, "$1 if (Rf3 !== 0 || Rr7 === 256) console.log('lane', T.lane, 'k', Rr7, 'x', Rf3, 'w', Rf1, 'r10', Rr10.toString(16), 'acc', Rf0, 'rd4', (Rrd4 - 2**36).toString(16), 'rd3', (Rrd3-2**36).toString(16), M.u8[Rrd4 - 2**36].toString(16));");
  return origLoad({ ...k, factory: new Function("M", src) });
};
const y = (await b.read(b.matmul(b.upload(x, [1, K], "f32", "x"), w))) as Float32Array;
console.log(y[0]);
