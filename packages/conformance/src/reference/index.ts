/** Reference implementations of every op of the Backend interface (plain, slow TypeScript). */
export * from "./attention.ts";
export * from "./conv.ts";
export * from "./elementwise.ts";
export * from "./layout.ts";
export * from "./matmul.ts";
export * from "./norm.ts";
export * from "./rope.ts";
export * from "./ssm.ts";
