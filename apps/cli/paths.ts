/**
 * Output paths of the CLI's commands, checked before any long work and written all-or-nothing:
 * - {@link checkOutputFolder}: the folder exists and is writable (`access(W_OK)`), the path is not a
 *   folder (E_IO naming the flag);
 * - {@link checkDistinctPaths}: no output is one of the inputs and no two outputs are the same file —
 *   compared by @tp/formats' `sameFile` (resolved paths: realpath of an existing file, else realpath
 *   of its folder + its name; and, when both exist, device and inode) (E_ARG naming both flags);
 * - {@link StagedOutputs}: every output written under a temporary name and all renamed at the end; on
 *   a failure the temporaries and any output already renamed are removed.
 */
import { accessSync, constants, existsSync, renameSync, rmSync, statSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { sameFile, temporaryPath } from "@tp/formats";
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
 * An output's folder exists and is writable, and the output is not a folder.
 * @throws TpError E_IO naming the flag and the folder (exit 1)
 */
export function checkOutputFolder(label: string, path: string): void {
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
 * Outputs written all-or-nothing: {@link stage} gives a temporary name beside each output to write
 * to; {@link commit} renames them all into place; {@link abort} (or a failed commit) removes the
 * temporaries and the outputs already renamed.
 */
export class StagedOutputs {
  readonly #staged: { label: string; path: string; tmp: string }[] = [];
  #done = false;

  /** A temporary path beside `path` (same folder, so the rename is atomic); write the output there. */
  stage(label: string, path: string): string {
    const tmp = temporaryPath(path);
    this.#staged.push({ label, path, tmp });
    return tmp;
  }

  /**
   * Rename every staged file into place.
   * @throws TpError E_IO naming the output that could not be renamed (nothing is left behind)
   */
  commit(): void {
    const renamed: string[] = [];
    for (const s of this.#staged) {
      try {
        renameSync(s.tmp, s.path);
        renamed.push(s.path);
      } catch (e) {
        for (const p of renamed) rmSync(p, { force: true });
        this.abort();
        throw new TpError("E_IO", `cannot write ${s.label} ${s.path}: ${(e as Error).message}`, {
          file: s.path,
          cause: e,
        });
      }
    }
    this.#done = true;
  }

  /** Remove the temporary files (after an error); a no-op after {@link commit}. */
  abort(): void {
    if (this.#done) return;
    for (const s of this.#staged) rmSync(s.tmp, { force: true });
    this.#done = true;
  }
}

/**
 * Write several outputs all-or-nothing: `fill` writes each to the temporary path `stage(label, path)`
 * returns; then all are renamed into place. On any error the temporaries (and outputs already
 * renamed) are removed and the error is rethrown.
 */
export function writeAllOrNothing(fill: (stage: (label: string, path: string) => string) => void): void {
  const staged = new StagedOutputs();
  try {
    fill((label, path) => staged.stage(label, path));
    staged.commit();
  } catch (e) {
    staged.abort();
    throw e;
  }
}
