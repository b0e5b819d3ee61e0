/**
 * Error helpers shared by the readers. Every problem with a file's bytes is a `TpError` with code
 * `E_FORMAT` whose message names the file, the tensor (when one is concerned) and the byte offset
 * where the problem was found (../shared/ARCHITECTURE.md, "Errors"; issue 3, "Hostile input").
 */
import { TpError } from "@tp/tensor";

/** Where in a file a problem was found. */
export interface Where {
  /** Path of the file. */
  file: string;
  /** Tensor name, when the problem concerns one tensor. */
  tensor?: string;
  /** Absolute byte offset in `file`. */
  offset?: number;
}

/**
 * A `TpError` with code `E_FORMAT`: the file's bytes do not follow its format.
 * @param message what was expected and what arrived
 * @param where   file, tensor and byte offset; each appears in the message
 */
export function formatError(message: string, where: Where): TpError {
  return new TpError("E_FORMAT", message, where);
}

/**
 * A `TpError` with code `E_IO` for a failed open/read/stat/write/rename, keeping the system error as
 * the cause. `ENOENT` and `EISDIR` get a plain-words message.
 */
export function ioError(action: string, file: string, cause: unknown): TpError {
  const code = (cause as { code?: string } | null)?.code;
  const why =
    code === "ENOENT"
      ? "no such file or directory"
      : code === "EISDIR"
        ? "is a directory"
        : code === "EACCES"
          ? "permission denied"
          : code === "ENOSPC"
            ? "no space left on device"
            : code === "EROFS"
              ? "read-only file system"
              : cause instanceof Error
                ? cause.message
                : String(cause);
  return new TpError("E_IO", `cannot ${action}: ${why}`, { file, cause });
}

/** `1536 B`, `12.0 KiB`, `4.50 GiB`: sizes in messages and tables (binary units). */
export function formatBytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB", "PiB"];
  let v = n / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(v < 10 ? 2 : 1)} ${units[i]}`;
}
