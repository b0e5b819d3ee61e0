/** Every conformance case, by op family. */
import type { ConformanceCase } from "../case.ts";
import { attentionCases } from "./attention.ts";
import { convCases2d } from "./conv.ts";
import { elementwiseCases } from "./elementwise.ts";
import { layoutCases } from "./layout.ts";
import { weightCases } from "./matmul.ts";
import { exactMatmulCases } from "./matmul-exact.ts";
import { normCases } from "./norm.ts";
import { ropeCases } from "./rope.ts";
import { ssmCases } from "./ssm.ts";
import { vectorCases } from "./vectors.ts";

export { MATMUL_FORMATS, makeWeight } from "./matmul.ts";
export { OP_VECTORS_PATH } from "./vectors.ts";

/** All cases of the suite, in a stable order (seeds are fixed per case). */
export function allCases(): ConformanceCase[] {
  return [
    ...elementwiseCases(),
    ...normCases(),
    ...ropeCases(),
    ...attentionCases(),
    ...convCases2d(),
    ...layoutCases(),
    ...weightCases(),
    ...exactMatmulCases(),
    ...vectorCases(),
    ...ssmCases(),
  ];
}
