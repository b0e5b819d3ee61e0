/**
 * Name-mapping tables: checkpoint names → the names the model code uses. A table is a list of rows
 * `[from, to]` with `{N}` standing for a block index; a row may take a row range of a fused tensor
 * (`rows: [start, end)` as fractions of the first dimension, e.g. the first half).
 */

/** One row of a name table. */
export interface NameRow {
  /** Pattern in the checkpoint, `{N}` = a block index (digits). */
  readonly from: string;
  /** Pattern in the model code; `null` = the tensor is not used (ignored). */
  readonly to: string | null;
  /** For a fused tensor: which part of its first dimension this target takes, as fractions. */
  readonly rows?: readonly [number, number];
}

/** A mapped name: the target and, for a fused tensor, the fraction of rows it takes. */
export interface MappedName {
  readonly name: string;
  readonly rows?: readonly [number, number];
}

/** A table with its source. */
export interface NameTable {
  /** Where the table comes from (file and repository, or spec section). */
  readonly source: string;
  readonly rows: readonly NameRow[];
}

function compile(pattern: string): RegExp {
  const src = pattern
    .split(/(\{N\}|\{\*\})/)
    .map((p) => (p === "{N}" ? "(\\d+)" : p === "{*}" ? "(.+)" : p.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")))
    .join("");
  return new RegExp(`^${src}$`);
}

function fill(pattern: string, captures: readonly string[]): string {
  let i = 0;
  return pattern.replace(/\{N\}|\{\*\}/g, () => captures[i++] ?? "");
}

const cache = new WeakMap<NameTable, { re: RegExp; row: NameRow }[]>();

/**
 * Map one checkpoint name through a table (the first matching row decides): the targets (several for
 * a fused tensor), `[]` when the table says the tensor is unused, and the name itself when no row
 * matches (tables list only what differs).
 */
export function mapName(table: NameTable, name: string): MappedName[] {
  let compiled = cache.get(table);
  if (!compiled) {
    compiled = table.rows.map((row) => ({ re: compile(row.from), row }));
    cache.set(table, compiled);
  }
  // First match wins; further rows with the same `from` are the other parts of a fused tensor.
  const out: MappedName[] = [];
  let first: string | null = null;
  for (const { re, row } of compiled) {
    if (first !== null && row.from !== first) continue;
    const m = re.exec(name);
    if (!m) continue;
    first = row.from;
    if (row.to === null) continue;
    const to = fill(row.to, m.slice(1));
    out.push(row.rows ? { name: to, rows: row.rows } : { name: to });
  }
  return first !== null ? out : [{ name }];
}

/** The reverse lookup: the checkpoint name that maps to `target` (first match), or null. */
export function unmapName(table: NameTable, target: string): string | null {
  for (const row of table.rows) {
    if (row.to === null || row.rows) continue;
    const m = compile(row.to).exec(target);
    if (m) return fill(row.from, m.slice(1));
  }
  return null;
}

/** A table that only strips a prefix (ComfyUI all-in-one files prefix `model.diffusion_model.`). */
export function stripPrefix(name: string, prefix: string): string {
  return prefix !== "" && name.startsWith(prefix) ? name.slice(prefix.length) : name;
}
