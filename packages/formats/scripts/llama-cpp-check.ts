/**
 * Load a GGUF file with llama.cpp (the prebuilt CPU binaries of node-llama-cpp 3.21.1, no download,
 * no build) and print one JSON line: whether it loaded, llama.cpp's view of it, and the first greedy
 * tokens after a fixed prompt. Run by gguf/llama-cpp.test.ts in a child process, so that a native
 * crash cannot take the test runner down.
 *
 * usage: bun packages/formats/scripts/llama-cpp-check.ts FILE.gguf [N_TOKENS]
 */
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const [path, n = "8"] = process.argv.slice(2);
if (path === undefined) {
  console.error("usage: llama-cpp-check.ts FILE.gguf [N_TOKENS]");
  process.exit(2);
}
try {
  const llama = await getLlama({
    gpu: false,
    build: "never",
    logLevel: LlamaLogLevel.error,
    progressLogs: false,
  });
  const model = await llama.loadModel({ modelPath: path });
  const context = await model.createContext({ contextSize: 128 });
  const prompt = model.tokenize("Once upon a time");
  const out: number[] = [];
  for await (const token of context.getSequence().evaluate(prompt, { temperature: 0 })) {
    out.push(token);
    if (out.length >= Number(n)) break;
  }
  console.log(
    JSON.stringify({ ok: true, nTensors: model.fileInfo.tensorInfo?.length ?? null, prompt, greedy: out }),
  );
  await context.dispose();
  await model.dispose();
  await llama.dispose();
} catch (e) {
  console.log(JSON.stringify({ ok: false, error: e instanceof Error ? e.message : String(e) }));
}
