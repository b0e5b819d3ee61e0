/**
 * JSON Schema → GBNF (./grammar.ts), for `response_format: {type: "json_schema"}`: a grammar whose
 * sentences are exactly the JSON texts that validate, for the subset below; `json_object` is any JSON
 * value that is an object.
 *
 * Supported: `type` (object, array, string, number, integer, boolean, null, or a list of them),
 * `properties` + `required` (properties in the schema's order; the optional ones may be left out;
 * no other keys unless `additionalProperties` is true or a schema), `items`, `minItems`, `maxItems`,
 * `enum`, `const`, `anyOf` / `oneOf`, `$ref` to `#/$defs/…` or `#/definitions/…`, string
 * `minLength` / `maxLength`, `pattern`-free strings. Anything else is refused (400) rather than
 * silently loosened. Whitespace between tokens is at most one space, so a model cannot pad forever.
 * Source: llama.cpp `common/json-schema-to-grammar.cpp` (the same approach: one rule per sub-schema,
 * primitives as fixed rules); JSON's grammar from RFC 8259.
 */
import { TpError } from "@tp/tensor";

/** The JSON primitives (RFC 8259 §6–7), numbers and strings as JSON spells them. */
const PRIMITIVES = `ws ::= " "?
json-string ::= "\\"" json-char* "\\""
json-char ::= [^"\\\\\\x00-\\x1f] | "\\\\" (["\\\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])
json-integer ::= "-"? ("0" | [1-9] [0-9]{0,15})
json-number ::= json-integer ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?
json-boolean ::= "true" | "false"
json-null ::= "null"
json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null
json-object ::= "{" ws (json-string ws ":" ws json-value ws ("," ws json-string ws ":" ws json-value ws)*)? "}"
json-array ::= "[" ws (json-value ws ("," ws json-value ws)*)? "]"
`;

/** A GBNF string literal for `text`. */
function literal(text: string): string {
  let out = '"';
  for (const ch of text) {
    const cp = ch.codePointAt(0) as number;
    if (ch === '"' || ch === "\\") out += `\\${ch}`;
    else if (cp < 0x20) out += `\\x${cp.toString(16).padStart(2, "0")}`;
    else out += ch;
  }
  return `${out}"`;
}

type Schema = Record<string, unknown> | boolean;

/** Compile `schema` to a GBNF grammar text (root = the schema's value). @throws TpError E_ARG */
export function schemaToGbnf(schema: unknown): string {
  if (typeof schema !== "object" || schema === null || Array.isArray(schema))
    throw new TpError("E_ARG", "the JSON schema must be an object");
  const rules: string[] = [];
  const done = new Map<string, string>();
  let n = 0;
  const root = schema as Record<string, unknown>;
  const defs = {
    ...((root.definitions as Record<string, Schema> | undefined) ?? {}),
    ...((root.$defs as Record<string, Schema> | undefined) ?? {}),
  };
  const bad = (where: string, msg: string): never => {
    throw new TpError("E_ARG", `JSON schema at ${where}: ${msg}`);
  };
  const rule = (body: string): string => {
    const name = `s${n++}`;
    rules.push(`${name} ::= ${body}`);
    return name;
  };
  const visit = (s: Schema, where: string, depth: number): string => {
    if (depth > 64) bad(where, "nested more than 64 deep (or a $ref cycle without an end)");
    if (s === true) return "json-value";
    if (s === false) bad(where, "false admits no value");
    const o = s as Record<string, unknown>;
    if (typeof o.$ref === "string") {
      const m = /^#\/(\$defs|definitions)\/(.+)$/.exec(o.$ref);
      if (m === null || !Object.hasOwn(defs, m[2] as string))
        bad(where, `$ref '${o.$ref}' is not a #/$defs/… entry of this schema`);
      const key = o.$ref;
      const known = done.get(key);
      if (known !== undefined) return known;
      const name = `s${n++}`;
      done.set(key, name); // recursive refs point at the name
      rules.push(`${name} ::= ${visit(defs[m?.[2] as string] as Schema, o.$ref, depth + 1)}`);
      return name;
    }
    if ("const" in o) return rule(literal(JSON.stringify(o.const)));
    if (Array.isArray(o.enum)) {
      if (o.enum.length === 0) bad(where, "an empty enum admits no value");
      return rule(o.enum.map((v) => literal(JSON.stringify(v))).join(" | "));
    }
    const union = (o.anyOf ?? o.oneOf) as Schema[] | undefined;
    if (union !== undefined) {
      if (!Array.isArray(union) || union.length === 0) bad(where, "anyOf / oneOf must be a non-empty list");
      return rule(union.map((u, i) => visit(u, `${where}/anyOf/${i}`, depth + 1)).join(" | "));
    }
    for (const k of ["pattern", "patternProperties", "allOf", "not", "if"])
      if (k in o) bad(where, `'${k}' is not supported`);
    let type = o.type;
    if (type === undefined) {
      if ("properties" in o) type = "object";
      else if ("items" in o) type = "array";
      else return "json-value";
    }
    if (Array.isArray(type)) {
      if (type.length === 0) bad(where, "an empty type list admits no value");
      return rule(type.map((t) => visit({ ...o, type: t }, where, depth + 1)).join(" | "));
    }
    switch (type) {
      case "string": {
        const min = o.minLength === undefined ? 0 : Number(o.minLength);
        const max = o.maxLength === undefined ? undefined : Number(o.maxLength);
        if (
          !Number.isSafeInteger(min) ||
          min < 0 ||
          min > 1000 ||
          (max !== undefined && (!Number.isSafeInteger(max) || max < min || max > 1000))
        )
          bad(where, "minLength / maxLength must be integers with 0 ≤ minLength ≤ maxLength ≤ 1000");
        if (min === 0 && max === undefined) return "json-string";
        return rule(`"\\"" json-char{${min},${max ?? ""}} "\\""`);
      }
      case "integer":
        return "json-integer";
      case "number":
        return "json-number";
      case "boolean":
        return "json-boolean";
      case "null":
        return "json-null";
      case "array": {
        const item =
          o.items === undefined ? "json-value" : visit(o.items as Schema, `${where}/items`, depth + 1);
        const min = o.minItems === undefined ? 0 : Number(o.minItems);
        const max = o.maxItems === undefined ? undefined : Number(o.maxItems);
        if (
          !Number.isSafeInteger(min) ||
          min < 0 ||
          min > 1000 ||
          (max !== undefined && (!Number.isSafeInteger(max) || max < min || max > 1000))
        )
          bad(where, "minItems / maxItems must be integers with 0 ≤ minItems ≤ maxItems ≤ 1000");
        const more = `("," ws ${item} ws)`;
        if (max === 0) return rule(`"[" ws "]"`);
        const first = `${item} ws ${more}{${Math.max(0, min - 1)},${max === undefined ? "" : max - 1}}`;
        return rule(min === 0 ? `"[" ws (${first})? "]"` : `"[" ws ${first} "]"`);
      }
      case "object": {
        const props = (o.properties ?? {}) as Record<string, Schema>;
        const required = new Set(Array.isArray(o.required) ? (o.required as string[]) : []);
        for (const r of required)
          if (!(r in props)) bad(where, `required property '${r}' has no schema in properties`);
        const extra = o.additionalProperties;
        if (extra !== undefined && extra !== false && Object.keys(props).length > 0)
          bad(where, "additionalProperties beside properties is not supported (set it to false)");
        const names = Object.keys(props);
        if (names.length === 0) return extra === false ? rule(`"{" ws "}"`) : "json-object";
        const kv = names.map(
          (k) =>
            `${literal(JSON.stringify(k))} ws ":" ws ${visit(props[k] as Schema, `${where}/properties/${k}`, depth + 1)} ws`,
        );
        // Properties in order; each optional one may be left out (the commas follow what is written).
        // the first written property: the first required one, or any optional one before it
        const starts: string[] = [];
        for (let i = 0; i < names.length; i++) {
          const rest = i + 1 < names.length ? restAfter(i + 1) : "";
          starts.push(`${kv[i]}${rest === "" ? "" : ` ${rest}`}`);
          if (required.has(names[i] as string)) break;
        }
        const anyRequired = names.some((k) => required.has(k));
        return rule(`"{" ws (${starts.join(" | ")})${anyRequired ? "" : "?"} "}"`);

        function restAfter(from: number): string {
          // what may follow property `from − 1`: properties from..end, required ones mandatory
          let r = "";
          for (let i = names.length - 1; i >= from; i--) {
            const item = `"," ws ${kv[i]}`;
            const tail = r === "" ? item : `${item} ${r}`;
            r = required.has(names[i] as string)
              ? rule(tail)
              : rule(r === "" ? `(${tail})?` : `${tail} | ${r}`);
          }
          return r;
        }
      }
      default:
        return bad(where, `type '${String(type)}' is not a JSON Schema type`);
    }
  };
  const top = visit(root, "#", 0);
  return `root ::= ws ${top} ws\n${rules.join("\n")}\n${PRIMITIVES}`;
}

/** The grammar of `json_object`: any JSON object. */
export const JSON_OBJECT_GBNF = `root ::= ws json-object ws\n${PRIMITIVES}`;
