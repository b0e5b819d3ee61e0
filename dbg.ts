import { loadBackend } from "@tp/tensor";
import { allCases } from "./packages/conformance/src/cases/index.ts";
const name = process.argv[2]!;
const c = allCases().find((x) => x.name.includes(name))!;
console.log(c.name);
for (const opts of [{}, { simulate: "sm_86" }]) {
  const b = await loadBackend(opts.simulate ? "ptx" : "cpu", opts as any);
  const out = await c.run(b);
  const arr = out[0]!.data as Float32Array;
  console.log(b.name, Array.from(arr.slice(0, 8)).map((v) => v.toFixed(4)).join(" "));
}
