/** The image side of the server (see startServer); filled in by the image milestone. */
import type { Backend } from "@tp/tensor";
import { TpError } from "@tp/tensor";

export interface ImageService {
  readonly name: string;
  readonly created: number;
  route(req: Request, url: URL, limit: number): Promise<[string, Response] | undefined>;
  metrics(
    metric: (name: string, type: "counter" | "gauge", help: string, values: [string, number][]) => void,
  ): void;
  dispose(): void;
}

export async function loadImageService(
  path: string,
  backend: Backend,
  options: { outputDir: string | undefined },
): Promise<ImageService> {
  void backend;
  void options;
  throw new TpError("E_UNSUPPORTED", "--image-model: the image API is not available yet", { file: path });
}
