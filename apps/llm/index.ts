#!/usr/bin/env bun
/**
 * `bun apps/llm --model F [--prompt P] [flags]` — chat with a language model: one answer with
 * --prompt (text streamed to stdout, or one JSON object with --json), else a REPL reading one message
 * per line from stdin. A thin driver over @tp/llm (`loadModel`, `GenerationSession`, `ChatSession`);
 * every failure is one `error E_CODE: …` line on stderr and a non-zero exit (runCli).
 * Flags: ./args.ts; behaviour: ../shared/spec/llm.md §9. Status lines (banner, summaries) go to stderr
 * as plain text; errors through console.error.
 */
import {
  ChatSession,
  ChatTemplate,
  chatTemplateFor,
  checkPromptFits,
  checkSpeculativeModel,
  DraftModelDrafter,
  Eagle3Drafter,
  type GenerateResult,
  GenerationSession,
  type LoadedModel,
  loadEagle3Head,
  loadModel,
  NgramDrafter,
  PLAIN_TEMPLATE,
  type SpeculativeOptions,
  targetEmbedding,
  tokensPerSecond,
} from "@tp/llm";
import { formatErrorLine, isTpError, loadBackend, peakRssBytes, runCli, TpError } from "@tp/tensor";
import { ctxRange, type LlmArgs, parseLlmArgs, USAGE } from "./args.ts";
import { parseHubModelRef, resolveModelArg } from "./hub-model.ts";
import { placing } from "./memory-args.ts";

/** Peak resident set size of this process in bytes (@tp/tensor peakRssBytes: its own VmHWM). */
export { peakRssBytes };

/** A status line on stderr: written plainly, since Bun colours console.error as an error. */
function status(line: string): void {
  process.stderr.write(`${line}\n`);
}

const MiB = 1024 * 1024;
const fmtS = (s: number) => s.toFixed(2);
const fmtRate = (x: number) => (x >= 100 ? x.toFixed(0) : x.toFixed(1));

/** Peak bytes of the device and the cpu backend (null: not in use), peak RSS, and the mapped weight files. */
interface MemoryFigures {
  devicePeak: number | null;
  cpuPeak: number | null;
  peakRss: number;
  mapped: number;
}

/** "peak device 12 MiB, peak cpu 3 MiB, peak RSS 210 MiB, mapped 16 MiB" (the summary's end). */
export function describeMemory(m: MemoryFigures): string {
  const mib = (b: number) => `${(b / MiB).toFixed(0)} MiB`;
  return [
    m.devicePeak === null ? "" : `peak device ${mib(m.devicePeak)}`,
    m.cpuPeak === null ? "" : `peak cpu ${mib(m.cpuPeak)}`,
    `peak RSS ${mib(m.peakRss)}`,
    `mapped ${mib(m.mapped)}`,
  ]
    .filter((x) => x !== "")
    .join(", ");
}

/** One line of stats after an answer, for stderr. */
function summary(r: GenerateResult, cached: number, window: number, kvBytes: number, memory: string): string {
  const tps = tokensPerSecond(r);
  const stop =
    r.stopReason === "eos"
      ? ""
      : `, stopped: ${r.stopReason === "length" ? "-n reached" : r.stopReason === "context" ? "context window full" : "interrupted"}`;
  return (
    `[prompt ${r.prefillTokens} tok${r.reusedTokens > 0 ? ` (+${r.reusedTokens} cached)` : ""} in ${fmtS(r.promptSeconds)} s, ${fmtRate(tps.prompt)} tok/s; ` +
    `generated ${r.ids.length} tok in ${fmtS(r.genSeconds)} s, ${fmtRate(tps.generation)} tok/s; ` +
    `ctx ${cached}/${window}, KV ${(kvBytes / MiB).toFixed(0)} MiB; ${memory}${stop}` +
    `${specSummary(r)}]`
  );
}

/**
 * The drafters swallow their own TpErrors (a round proposes nothing and decoding goes on, speculative.ts):
 * a notice on stderr the first time a new one is seen, so that a draft model or head that cannot run
 * (e.g. out of device memory under --vram-budget) is not a silent "accepted 0/0 drafts".
 */
function drafterNotices(drafter: { kind: string; lastError?: unknown } | undefined): () => void {
  let seen: unknown;
  return () => {
    const e = drafter?.lastError;
    if (e === undefined || e === seen) return;
    seen = e;
    const what = isTpError(e) ? `${e.code}: ${e.message}` : String(e);
    status(
      `notice: speculative ${drafter?.kind}: a drafting round failed and proposed nothing (${what}); the answer is the target's own, without those drafts`,
    );
  };
}

/** "; spec ngram: accepted 24/42 drafts (57%), 1.23 tok per verify step", or "" without speculation. */
function specSummary(r: GenerateResult): string {
  const s = r.speculative;
  if (s === undefined) return "";
  return (
    `; spec ${s.drafter}: accepted ${s.accepted}/${s.drafted} drafts (${(100 * s.acceptanceRate).toFixed(0)}%), ` +
    `${s.tokensPerStep.toFixed(2)} tok per verify step`
  );
}

/**
 * The speculative options the flags ask for (undefined for none), and what to free afterwards (the
 * draft model, the EAGLE-3 head and its drafter).
 * @throws TpError E_UNSUPPORTED for a target / draft whose architecture cannot roll back, or a target
 *   that cannot tap its hidden states (eagle3); E_ARG for a draft model or head of another vocabulary;
 *   the head's load errors (E_FORMAT naming the file and tensor)
 */
function speculativeSetup(
  args: LlmArgs,
  target: LoadedModel,
  backend: LoadedModel["model"]["backend"],
): { options: SpeculativeOptions | undefined; draft: LoadedModel | undefined; dispose?: () => void } {
  const sp = args.speculative;
  if (sp.type === "none") return { options: undefined, draft: undefined };
  checkSpeculativeModel(target.model);
  const limits = {
    ...(sp.draftMax === undefined ? {} : { draftMax: sp.draftMax }),
    ...(sp.draftMin === undefined ? {} : { draftMin: sp.draftMin }),
  };
  if (sp.type === "ngram") return { options: { drafter: new NgramDrafter(), ...limits }, draft: undefined };
  if (sp.type === "eagle3") {
    const embedding = targetEmbedding(target.model);
    const head = overDeviceBudget("the EAGLE-3 head (--eagle)", sp.eagle as string, backend, () =>
      loadEagle3Head(
        sp.eagle as string,
        backend,
        target.model.config,
        embedding === undefined ? {} : { targetEmbedding: embedding },
      ),
    );
    try {
      const drafter = new Eagle3Drafter(head, target.model, { stopIds: target.tokenizer.eog });
      return {
        options: { drafter, ...limits },
        draft: undefined,
        dispose: () => {
          drafter.dispose();
          head.dispose();
        },
      };
    } catch (e) {
      head.dispose();
      throw e;
    }
  }
  const draft = loadDraft(sp.modelDraft as string, backend, target.model.maxContext);
  try {
    const drafter = new DraftModelDrafter(draft.model, target, {
      draftTokenizer: draft.tokenizer,
      ...(sp.pMin === undefined ? {} : { pMin: sp.pMin }),
    });
    return { options: { drafter, ...limits }, draft };
  } catch (e) {
    draft.model.dispose();
    throw e;
  }
}

/** A download progress line per file on stderr: bytes, rate and ETA (redrawn at most 4 times a second). */
function progressLine(): (path: string, done: number, total: number) => void {
  let file = "";
  let t0 = 0;
  let last = 0;
  const mib = (b: number) => `${(b / MiB).toFixed(1)} MiB`;
  return (path, done, total) => {
    const now = performance.now();
    if (path !== file) {
      file = path;
      t0 = now;
    }
    if (now - last < 250 && done < total) return;
    last = now;
    const rate = done / Math.max((now - t0) / 1000, 1e-3);
    const eta = rate > 0 ? (total - done) / rate : 0;
    process.stderr.write(
      `downloading ${path}  ${mib(done)} / ${mib(total)}  ${mib(rate)}/s  ETA ${eta.toFixed(0)} s${done >= total ? "\n" : "\r"}`,
    );
  };
}

/**
 * `load()`, an E_OOM of it naming `what` and `file`: a draft model or EAGLE-3 head goes to the target's
 * backend, under what the target's --vram-budget left (so its first weight's E_OOM alone names no flag).
 */
function overDeviceBudget<T>(what: string, file: string, backend: { name: string }, load: () => T): T {
  try {
    return load();
  } catch (e) {
    if (!(e instanceof TpError) || e.code !== "E_OOM") throw e;
    throw new TpError("E_OOM", `${what} does not fit on ${backend.name}: ${e.message}`, { file, cause: e });
  }
}

/**
 * The draft model, with the target's context window. A draft trained on a shorter context cannot
 * follow the target to its end: that is an E_ARG naming -md and --ctx (not loadModel's "maxContext",
 * which names no flag). @throws TpError E_ARG, E_OOM naming -md (its weights over the device's budget),
 *   and loadModel's errors
 */
function loadDraft(file: string, backend: LoadedModel["model"]["backend"], window: number): LoadedModel {
  try {
    return overDeviceBudget("the draft model (-md)", file, backend, () =>
      loadModel(file, { backend, maxContext: window }),
    );
  } catch (e) {
    if (!(e instanceof TpError) || e.code !== "E_ARG" || !e.message.startsWith("maxContext")) throw e;
    const ceiling = /from 1 to (\d+)/.exec(e.message)?.[1] ?? "fewer";
    throw new TpError(
      "E_ARG",
      `the draft model (-md) takes at most ${ceiling} tokens of context, less than the target's window of ${window}; give --ctx ${ceiling} or less (or a draft of the target's family)`,
      { file },
    );
  }
}

async function main(args: LlmArgs): Promise<number> {
  if (args.help) {
    console.log(USAGE);
    return 0;
  }
  if (parseHubModelRef(args.model) !== null) {
    args.model = await resolveModelArg(args.model, { onProgress: progressLine() });
    if (!args.json) status(`[model file: ${args.model}]`);
  }
  const t0 = performance.now();
  const threads = args.threads === undefined ? {} : { threads: args.threads };
  const backend = await loadBackend(args.backend, threads);
  const mem = args.memory;
  // the cpu backend of a placed model's other layers, or the one backend when it is the cpu
  const host = placing(mem) ? await loadBackend("cpu", threads) : backend.name === "cpu" ? backend : null;
  if (mem.ramBudget !== undefined) {
    if (host === null)
      throw new TpError(
        "E_ARG",
        `--ram-budget limits the cpu backend, which --backend ${args.backend} without -ngl / --vram-budget does not use`,
      );
    host.memory.setBudget(mem.ramBudget);
  }
  const memoryFigures = (): MemoryFigures => ({
    devicePeak: backend === host ? null : backend.memory.peak,
    cpuPeak: host?.memory.peak ?? null,
    peakRss: peakRssBytes(),
    mapped: loaded.mappedBytes,
  });
  let loaded: ReturnType<typeof loadModel>;
  try {
    loaded = loadModel(args.model, {
      backend,
      ...(args.ctx === undefined ? {} : { maxContext: args.ctx }),
      ...(!placing(mem) || host === null
        ? {}
        : {
            placement: {
              host,
              ...(mem.gpuLayers === undefined ? {} : { gpuLayers: mem.gpuLayers }),
              ...(mem.cpuLayers === undefined ? {} : { cpuLayers: mem.cpuLayers }),
              cpuMoe: mem.cpuMoe,
              ...(mem.nCpuMoe === undefined ? {} : { nCpuMoe: mem.nCpuMoe }),
              ...(mem.vramBudget === undefined ? {} : { vramBudget: mem.vramBudget }),
              onPlan: (line: string) => {
                if (!args.json) status(`[${line}]`);
              },
            },
          }),
    });
  } catch (e) {
    // The library names its option (maxContext) and the model's ceiling; say it with the flag.
    const ceiling = isTpError(e, "E_ARG") ? /from 1 to (\d+)/.exec(e.message)?.[1] : undefined;
    if (
      args.ctx !== undefined &&
      ceiling !== undefined &&
      e instanceof Error &&
      e.message.startsWith("maxContext")
    )
      throw new TpError("E_ARG", `--ctx must be ${ctxRange(Number(ceiling))}, got '${args.ctx}'`, {
        cause: e,
      });
    throw e;
  }
  const { model, tokenizer } = loaded;
  if (loaded.unexpected.length > 0) {
    const u = loaded.unexpected;
    console.error(
      `notice: ${args.model} holds ${u.length} tensor${u.length === 1 ? "" : "s"} the model does not read (${u.slice(0, 3).join(", ")}${u.length > 3 ? ", …" : ""}); ignored`,
    );
  }
  let spec: ReturnType<typeof speculativeSetup>;
  try {
    spec = speculativeSetup(args, loaded, backend);
  } catch (e) {
    model.dispose();
    throw e;
  }
  const hasTemplate = tokenizer.chatTemplate !== undefined && tokenizer.chatTemplate.trim() !== "";
  const raw = args.raw || !hasTemplate;
  const template = raw
    ? new ChatTemplate(PLAIN_TEMPLATE, { kind: "plain", source: tokenizer.source })
    : chatTemplateFor(tokenizer);
  if (args.think !== undefined && (raw || !template.source.includes("enable_thinking")))
    throw new TpError(
      "E_ARG",
      `${args.think ? "--think" : "--no-think"}: ${raw ? "there is no chat template in use (--raw, or the file has none)" : "the chat template has no enable_thinking switch"}`,
      { file: args.model },
    );
  const session = new GenerationSession(model, tokenizer, args.seed === undefined ? {} : { seed: args.seed });
  const chat = new ChatSession(session, template, {
    ...(args.system === undefined ? {} : { system: args.system }),
    ...(args.think === undefined ? {} : { enableThinking: args.think }),
  });
  const setupSeconds = (performance.now() - t0) / 1000;
  const genOptions = {
    sampling: { ...args.sampling },
    maxNewTokens: args.nPredict,
    ...(spec.options === undefined ? {} : { speculative: spec.options }),
  };
  const banner = (promptTokens?: number) =>
    `[${backend.name} backend: ${backend.device}, ${model.config.architecture}, ${promptTokens === undefined ? "" : `${promptTokens} prompt tokens, `}` +
    `ctx window ${model.maxContext}, max ${args.nPredict} new/turn, temp ${args.sampling.temperature}, ` +
    `seed ${session.seed}${raw ? ", raw text (no chat template)" : ""}` +
    `${spec.options === undefined ? "" : `, speculative ${spec.options.drafter.kind}${(args.speculative.modelDraft ?? args.speculative.eagle) === undefined ? "" : ` (${args.speculative.modelDraft ?? args.speculative.eagle})`}`}; setup ${fmtS(setupSeconds)} s]`;

  const drafterNotice = drafterNotices(spec.options?.drafter);
  // Ctrl-C: stop the current answer; while waiting for input, the terminal has dropped the typed line.
  let current: AbortController | null = null;
  process.on("SIGINT", () => {
    if (current !== null) current.abort();
    else if (args.prompt !== undefined) process.exit(130);
    else process.stderr.write("\n(/exit or Ctrl-D quits)\n> ");
  });

  try {
    if (args.prompt !== undefined) {
      const promptIds = chat.promptIds(args.prompt);
      checkPromptFits(model, promptIds.length);
      if (!args.json) status(banner(promptIds.length));
      current = new AbortController();
      const r = await chat.send(args.prompt, {
        ...genOptions,
        signal: current.signal,
        ...(args.json ? {} : { onText: (t: string) => process.stdout.write(t) }),
      });
      current = null;
      drafterNotice();
      if (args.json) {
        const tps = tokensPerSecond(r);
        console.log(
          JSON.stringify({
            prompt_ids: promptIds,
            ids: r.ids,
            text: r.text,
            prompt_tokens: r.promptTokens,
            prompt_tokens_per_second: tps.prompt,
            tokens_per_second: tps.generation,
            prompt_seconds: r.promptSeconds,
            generation_seconds: r.genSeconds,
            stop_reason: r.stopReason,
            seed: String(session.seed), // the base seed: --seed with it reproduces this run
            peak_rss_bytes: peakRssBytes(),
            backend_peak_bytes: backend.memory.peak,
            device_peak_bytes: memoryFigures().devicePeak,
            cpu_peak_bytes: memoryFigures().cpuPeak,
            mapped_bytes: loaded.mappedBytes,
            ctx: model.maxContext,
            ...(r.speculative === undefined
              ? {}
              : {
                  speculative: {
                    type: r.speculative.drafter,
                    verify_steps: r.speculative.verifySteps,
                    drafted: r.speculative.drafted,
                    accepted: r.speculative.accepted,
                    acceptance_rate: r.speculative.acceptanceRate,
                    tokens_per_verify_step: r.speculative.tokensPerStep,
                  },
                }),
          }),
        );
      } else {
        process.stdout.write("\n");
        status(summary(r, model.cached, model.maxContext, model.kvBytes, describeMemory(memoryFigures())));
      }
      return 0;
    }
    // Render the template once before the banner, so that a broken one fails now, not at the first line.
    chat.promptIds("Hello");
    return await repl(
      chat,
      genOptions,
      banner(),
      (c) => {
        current = c;
      },
      memoryFigures,
    );
  } finally {
    spec.draft?.model.dispose();
    spec.dispose?.();
    model.dispose();
    backend.dispose();
    if (host !== null && host !== backend) host.dispose();
  }
}

/** The REPL: one message per line on stdin; /reset, /exit; errors of a turn are printed, not fatal. */
async function repl(
  chat: ChatSession,
  genOptions: { sampling: object; maxNewTokens: number; speculative?: SpeculativeOptions },
  banner: string,
  setCurrent: (c: AbortController | null) => void,
  memoryFigures: () => MemoryFigures,
): Promise<number> {
  const tty = process.stdin.isTTY === true;
  const model = chat.session.model;
  const drafterNotice = drafterNotices(genOptions.speculative?.drafter);
  status(banner);
  status(
    "[one message per line; /reset clears the conversation, /exit or Ctrl-D quits, Ctrl-C stops an answer]",
  );
  if (tty) process.stderr.write("> ");
  for await (const line of console) {
    const text = line.trim();
    if (text === "/exit" || text === "/quit") break;
    if (text === "/reset") {
      chat.reset();
      status("[conversation cleared]");
    } else if (text !== "") {
      const c = new AbortController();
      setCurrent(c);
      try {
        const r = await chat.send(line, {
          ...genOptions,
          signal: c.signal,
          onText: (t: string) => process.stdout.write(t),
        });
        process.stdout.write("\n");
        drafterNotice();
        status(summary(r, model.cached, model.maxContext, model.kvBytes, describeMemory(memoryFigures())));
      } catch (e) {
        if (!(e instanceof TpError) || e.code !== "E_ARG") throw e;
        // e.g. context window full: /reset and go on
        const full = e.message.startsWith("context window full");
        console.error(`${formatErrorLine(e)}${full ? "; /reset clears the conversation" : ""}`);
      } finally {
        setCurrent(null);
      }
    }
    if (tty) process.stderr.write("> ");
  }
  return 0;
}

// `bun apps/llm serve …` is `bun apps/server …`
if (Bun.argv[2] === "serve")
  await runCli(async () => (await import("@tp/app-server")).serverMain(Bun.argv.slice(3)));
await runCli(() => main(parseLlmArgs(Bun.argv.slice(2))));
