/**
 * The benchmark's prompt: `n` token ids drawn from the ordinary part of Qwen3's vocabulary
 * ([0, 151643), below the special tokens) with a fixed LCG, the same for us and for llama.cpp.
 */
export function benchPromptIds(n: number): number[] {
  const out: number[] = [];
  let x = 12345;
  for (let i = 0; i < n; i++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    out.push(x % 151643);
  }
  return out;
}
