/** The PTX emitter and kernel templates of the ptx backend (see each file for the maths). */
export * from "./attention.ts";
export * from "./casts.ts";
export * from "./catalogue.ts";
export * from "./dataflow.ts";
export * from "./elementwise.ts";
export * from "./emit.ts";
export * from "./gather.ts";
export * from "./matmul.ts";
export * from "./mma-tiled.ts";
export * from "./moe.ts";
export * from "./rows.ts";
