/**
 * The one error class of TensorPencil. Every failure a user can cause (a missing or truncated file, a
 * wrong layout, an unsupported format on a backend, a bad shape or flag, an exhausted memory budget)
 * is a `TpError` with a stable `code`; the message names the file, tensor, op or flag and says what
 * to do. CLIs print it on one line (`formatErrorLine`) and exit non-zero.
 *
 * Source: ../shared/ARCHITECTURE.md, "Errors".
 */

/** Stable error codes. Programs may switch on them; messages may change. */
export const ERROR_CODES = {
  /** A file's bytes do not follow its format (bad header, offsets out of range, ...). */
  E_FORMAT: "malformed file contents",
  /** A file or library cannot be opened, read, written or renamed. */
  E_IO: "input/output failure",
  /** A valid request that this build or backend cannot serve (op × format, dtype, backend). */
  E_UNSUPPORTED: "not supported",
  /** Shapes that do not fit together (broadcast, reshape, matmul K mismatch, ...). */
  E_SHAPE: "shape mismatch",
  /** An allocation failed or would exceed a memory budget. */
  E_OOM: "out of memory",
  /** A bad argument or flag value from the caller. */
  E_ARG: "bad argument",
  /** A tensor used after it was freed, or on the wrong backend. */
  E_STATE: "invalid state",
  /** A result holds NaN or ±∞ (broken weights or inputs); the message names the stage and step. */
  E_NUMERIC: "non-finite result",
  /** A failure inside native code that the caller did not cause. */
  E_INTERNAL: "internal error",
} as const;

/** One of the keys of {@link ERROR_CODES}. */
export type TpErrorCode = keyof typeof ERROR_CODES;

/** Context attached to a {@link TpError}; each field, when present, appears in the message. */
export interface TpErrorContext {
  /** Path of the file involved. */
  file?: string;
  /** Name of the tensor involved. */
  tensor?: string;
  /** Byte offset inside `file` where the problem was found. */
  offset?: number;
  /** The underlying error, for stack traces. */
  cause?: unknown;
}

/**
 * TensorPencil's error: `code` is one of {@link ERROR_CODES}; `message` is
 * `"<what happened> (file F, tensor T, offset O)"` with only the known parts.
 *
 * @example new TpError("E_SHAPE", "matmul: x [2,3] and w [4,5] disagree on K (3 vs 5)")
 */
export class TpError extends Error {
  /** Stable machine-readable code. */
  readonly code: TpErrorCode;
  /** File path, when the error concerns a file. */
  readonly file: string | undefined;
  /** Tensor name, when the error concerns a tensor. */
  readonly tensor: string | undefined;
  /** Byte offset in `file`, when known. */
  readonly offset: number | undefined;

  constructor(code: TpErrorCode, message: string, context: TpErrorContext = {}) {
    const where: string[] = [];
    // a wrapped error's message may already name the file: "(file X) (file X)" says it twice
    if (context.file !== undefined && !message.includes(`(file ${context.file}`))
      where.push(`file ${printable(context.file)}`);
    if (context.tensor !== undefined) where.push(`tensor ${printable(context.tensor)}`);
    if (context.offset !== undefined) where.push(`offset ${context.offset}`);
    super(
      where.length > 0 ? `${message} (${where.join(", ")})` : message,
      context.cause === undefined ? undefined : { cause: context.cause },
    );
    this.name = "TpError";
    this.code = code;
    this.file = context.file;
    this.tensor = context.tensor;
    this.offset = context.offset;
  }
}

/**
 * `s` with control characters written as `\uXXXX`, so that a name read from a hostile file (a tensor
 * name holding a newline) cannot break the one-line message.
 */
function printable(s: string): string {
  // biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are what it escapes
  return s.replace(/[\u0000-\u001f\u007f]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

/** True when `e` is a {@link TpError}, optionally with the given code. */
export function isTpError(e: unknown, code?: TpErrorCode): e is TpError {
  return e instanceof TpError && (code === undefined || e.code === code);
}

/**
 * One line for a terminal: `error E_CODE: message`. Newlines inside the message are folded so that
 * the line stays one line. A non-TpError is reported as E_INTERNAL with its own message.
 */
export function formatErrorLine(e: unknown): string {
  const code = e instanceof TpError ? e.code : "E_INTERNAL";
  const message = e instanceof Error ? e.message : String(e);
  return `error ${code}: ${message.replace(/\s*\n\s*/g, " ")}`;
}

/**
 * Run a CLI's main function: on a thrown error print {@link formatErrorLine} to stderr and exit with
 * status 1 (2 for E_ARG, the usage convention of getopt programs). Returns main's exit code otherwise.
 * Set TP_DEBUG=1 to print the stack as well.
 */
export async function runCli(main: () => Promise<number | undefined> | number | undefined): Promise<never> {
  let status = 0;
  try {
    status = (await main()) ?? 0;
  } catch (e) {
    console.error(formatErrorLine(e));
    if (process.env.TP_DEBUG && e instanceof Error && e.stack) console.error(e.stack);
    status = e instanceof TpError && e.code === "E_ARG" ? 2 : 1;
  }
  process.exit(status);
}
