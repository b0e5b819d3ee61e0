/**
 * Output paths of the CLI's commands, checked before any long work and written all-or-nothing:
 * - {@link checkOutputFolder}: the folder exists and is writable (`access(W_OK)`), the path is not a
 *   folder (E_IO naming the flag);
 * - {@link checkDistinctPaths}: no output is one of the inputs and no two outputs are the same file —
 *   compared by @tp/formats' `sameFile` (resolved paths: realpath of an existing file, else realpath
 *   of its folder + its name; and, when both exist, device and inode) (E_ARG naming both flags);
 * - {@link writeAllOrNothing}: every output written under a temporary name and all renamed at the end;
 *   on a failure the temporaries and any output already renamed are removed.
 */
import { accessSync, constants, existsSync, statSync } from "node:fs";
import { basename, dirname, resolve } from "node:path";
import { writeAllOrNothing as formatsWriteAllOrNothing, sameFile } from "@tp/formats";
import { TpError } from "@tp/tensor";

/** A path and how the user named it: a flag (`--cond-out`) or a positional (`OUT`). */
export interface NamedPath {
  readonly label: string;
  readonly path: string;
}

/**
 * No output may be an input, and no two outputs may be the same file.
 * @throws TpError E_ARG naming both flags (exit 2)
 */
export function checkDistinctPaths(inputs: readonly NamedPath[], outputs: readonly NamedPath[]): void {
  for (const [i, o] of outputs.entries()) {
    for (const input of inputs) {
      if (sameFile(o.path, input.path)) {
        throw new TpError(
          "E_ARG",
          `${o.label} ${o.path} is the same file as ${input.label} ${input.path}; writing it would overwrite the input — choose another ${o.label}`,
        );
      }
    }
    for (const other of outputs.slice(0, i)) {
      if (sameFile(o.path, other.path)) {
        throw new TpError(
          "E_ARG",
          `${other.label} ${other.path} and ${o.label} ${o.path} are the same file; one would overwrite the other — give them different paths`,
        );
      }
    }
  }
}

/**
 * An output's folder exists and is writable, and the output is not a folder (nor a path ending in `/`).
 * @throws TpError E_IO naming the flag and the folder (exit 1)
 */
export function checkOutputFolder(label: string, path: string): void {
  if (/[\\/]$/.test(path) || basename(path) === "." || basename(path) === "..") {
    throw new TpError("E_IO", `${label} ${path} names a folder, not a file; give a file name`, {
      file: path,
    });
  }
  const dir = dirname(resolve(path));
  if (!existsSync(dir) || !statSync(dir).isDirectory()) {
    throw new TpError("E_IO", `${label} ${path}: the folder ${dir} does not exist`, { file: path });
  }
  try {
    accessSync(dir, constants.W_OK);
  } catch (e) {
    const code = (e as { code?: string }).code;
    throw new TpError(
      "E_IO",
      `${label} ${path}: the folder ${dir} is not writable (${code === "EROFS" ? "read-only file system" : "permission denied"})`,
      { file: path },
    );
  }
  if (existsSync(path) && statSync(path).isDirectory()) {
    throw new TpError("E_IO", `${label} ${path} is a directory`, { file: path });
  }
}

/**
 * Write several outputs all-or-nothing (@tp/formats' `writeAllOrNothing`): `fill` names each output
 * with `stage(label, path)` and writes it by its own path; all are renamed into place once all are
 * written, none otherwise.
 */
export const writeAllOrNothing = formatsWriteAllOrNothing;
