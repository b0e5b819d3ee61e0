/**
 * The backend registry: backends are chosen at run time by name (`--backend cpu|vulkan|ptx|cuda`), so
 * no pipeline imports a backend package directly (../shared/ARCHITECTURE.md, "Layout").
 *
 * Built-in names map to packages that export `createBackend(options)`; the package is imported only
 * when that backend is asked for, so a machine without a GPU stack never loads the GPU code. Programs
 * can add their own with {@link registerBackend}.
 */

import type { Backend } from "./backend.ts";
import type { BackendOptions } from "./base.ts";
import { TpError } from "./errors.ts";

/** Creates a backend; may be async (device discovery). */
export type BackendFactory = (options: BackendOptions) => Backend | Promise<Backend>;

/** Built-in backend names and the packages that implement them. */
export const BUILTIN_BACKENDS: Readonly<Record<string, string>> = {
  cpu: "@tp/backend-cpu",
  vulkan: "@tp/backend-vulkan",
  ptx: "@tp/backend-ptx",
  cuda: "@tp/backend-cudalibs",
};

/**
 * A registry instance. The module exports a default one ({@link registerBackend}, {@link loadBackend});
 * tests and embedders may make their own.
 */
export class BackendRegistry {
  readonly #factories = new Map<string, BackendFactory>();

  /**
   * Register (or replace) a backend factory under `name`.
   * @throws TpError E_ARG for an empty or non-identifier name.
   */
  register(name: string, factory: BackendFactory): void {
    if (typeof name !== "string" || !/^[a-z][a-z0-9_-]*$/.test(name)) {
      throw new TpError("E_ARG", `backend name '${name}' must be lower-case letters, digits, '-' or '_'`);
    }
    if (typeof factory !== "function") {
      throw new TpError("E_ARG", `backend '${name}': the factory must be a function (options) => Backend`);
    }
    this.#factories.set(name, factory);
  }

  /** Every name that `load` accepts: built-ins first, then registered ones. */
  names(): string[] {
    return [...new Set([...Object.keys(BUILTIN_BACKENDS), ...this.#factories.keys()])];
  }

  /**
   * Create the backend called `name`.
   * @throws TpError E_ARG for an unknown name (listing the known ones); E_UNSUPPORTED when the
   *   backend's package is not installed or exports no `createBackend`; whatever the factory throws
   *   (e.g. E_UNSUPPORTED naming a missing driver).
   */
  async load(name: string, options: BackendOptions = {}): Promise<Backend> {
    const factory = this.#factories.get(name) ?? (await this.#builtin(name));
    const backend = await factory(options);
    if (typeof backend !== "object" || backend === null || typeof backend.alloc !== "function") {
      throw new TpError(
        "E_INTERNAL",
        `the factory of backend '${name}' returned ${String(backend)}, not a Backend`,
      );
    }
    return backend;
  }

  async #builtin(name: string): Promise<BackendFactory> {
    const pkg = Object.hasOwn(BUILTIN_BACKENDS, name) ? BUILTIN_BACKENDS[name] : undefined;
    if (pkg === undefined) {
      throw new TpError("E_ARG", `unknown backend '${name}'; expected one of: ${this.names().join(", ")}`);
    }
    let mod: { createBackend?: unknown };
    try {
      mod = await importPackage(pkg);
    } catch (e) {
      throw new TpError(
        "E_UNSUPPORTED",
        `backend '${name}' needs the package ${pkg}, which cannot be loaded: ${(e as Error).message}`,
        { cause: e },
      );
    }
    if (typeof mod.createBackend !== "function") {
      throw new TpError("E_UNSUPPORTED", `package ${pkg} does not export createBackend(options)`);
    }
    const factory = mod.createBackend as BackendFactory;
    this.#factories.set(name, factory);
    return factory;
  }
}

/**
 * Import a package by name: from where @tp/tensor is installed (hoisted installs: npm, bun's
 * "hoisted" linker), else from the current directory's project (isolated installs, where only the
 * application can see its own dependencies).
 */
async function importPackage(pkg: string): Promise<{ createBackend?: unknown }> {
  try {
    return await import(pkg);
  } catch (first) {
    let path: string;
    try {
      path = Bun.resolveSync(pkg, process.cwd());
    } catch {
      throw first;
    }
    return await import(path);
  }
}

/** The process-wide registry used by the CLIs. */
export const defaultRegistry = new BackendRegistry();

/** Register a backend factory in the default registry. @throws TpError E_ARG for a bad name. */
export function registerBackend(name: string, factory: BackendFactory): void {
  defaultRegistry.register(name, factory);
}

/** Load a backend by name from the default registry. See {@link BackendRegistry.load}. */
export function loadBackend(name: string, options: BackendOptions = {}): Promise<Backend> {
  return defaultRegistry.load(name, options);
}

/** Names the default registry accepts. */
export function backendNames(): string[] {
  return defaultRegistry.names();
}
