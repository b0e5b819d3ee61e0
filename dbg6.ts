import { gemvKernel } from "./packages/backend-ptx/src/ptx/matmul.ts";
import { ptxModule } from "./packages/backend-ptx/src/ptx/emit.ts";
console.log(ptxModule(86, [gemvKernel({ format: "f8_e4m3fn", bias: false, scaled: false } as any)]));
