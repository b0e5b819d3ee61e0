/**
 * @tp/conformance (private): the shared conformance suite — plain TypeScript references of every op
 * of the Backend interface, per-op tolerances, and the cases every backend runs
 * (`conformance.test.ts`). See README.md.
 */
export * from "./case.ts";
export * from "./cases/index.ts";
export * from "./compare.ts";
export * from "./data.ts";
export * from "./host.ts";
export * from "./reference/index.ts";
export * from "./suite.ts";
export * from "./tolerances.ts";
