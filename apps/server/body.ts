/**
 * Request bodies: JSON within `--max-body`, enforced from Content-Length and while reading (a chunked
 * body has no length to check first), so that a body of any size costs at most `limit` bytes of memory
 * and is answered with the OpenAI error shape.
 */
import { ApiError, badRequest } from "./errors.ts";

/** The request's body as text (UTF-8), at most `limit` bytes read. @throws ApiError 413 */
export async function textBody(req: Request, limit: number): Promise<string> {
  const declared = Number(req.headers.get("content-length") ?? "0");
  if (declared > limit) throw tooLarge(declared, limit);
  // Read at most `limit` bytes (a chunked body has no length to check first).
  const chunks: Uint8Array[] = [];
  let n = 0;
  if (req.body !== null) {
    const reader = req.body.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      n += value.length;
      if (n > limit) {
        await reader.cancel().catch(() => {});
        throw tooLarge(n, limit, "at least ");
      }
      chunks.push(value);
    }
  }
  const bytes = new Uint8Array(n);
  let at = 0;
  for (const c of chunks) {
    bytes.set(c, at);
    at += c.length;
  }
  return new TextDecoder().decode(bytes);
}

/** The request's JSON body, within the size limit. @throws ApiError 413, 400 */
export async function jsonBody(req: Request, limit: number): Promise<unknown> {
  const text = await textBody(req, limit);
  try {
    return JSON.parse(text);
  } catch (e) {
    throw badRequest(`the request body is not valid JSON: ${(e as Error).message}`);
  }
}

function tooLarge(n: number, limit: number, atLeast = ""): ApiError {
  return new ApiError(
    413,
    "invalid_request_error",
    `the request body has ${atLeast}${n} bytes; the limit is ${limit} (--max-body)`,
    null,
    "request_too_large",
  );
}
