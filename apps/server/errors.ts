/**
 * Errors as the OpenAI API answers them: `{"error": {"message", "type", "param", "code"}}` with an
 * HTTP status (400 bad request, 401 bad key, 404 unknown model or route, 413 too large, 503 busy,
 * 500 a failure of ours). A `TpError` from the engine maps by its code: E_ARG is the request's fault
 * (400), anything else is the server's (500).
 * Source: the OpenAI API reference, "Error codes"; llama.cpp `tools/server/utils.hpp` `format_error_response`.
 */
import { TpError } from "@tp/tensor";

/** OpenAI error `type`s. */
export type ApiErrorType =
  | "invalid_request_error"
  | "authentication_error"
  | "not_found_error"
  | "unavailable_error"
  | "server_error";

/** An error with the HTTP status and OpenAI type it is answered with. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly type: ApiErrorType,
    message: string,
    readonly param: string | null = null,
    readonly code: string | null = null,
  ) {
    super(message);
  }

  /** The OpenAI error body. */
  body(): { error: { message: string; type: ApiErrorType; param: string | null; code: string | number } } {
    return {
      error: { message: this.message, type: this.type, param: this.param, code: this.code ?? this.status },
    };
  }
}

/** 400 naming the parameter. */
export function badRequest(
  message: string,
  param: string | null = null,
  code: string | null = null,
): ApiError {
  return new ApiError(400, "invalid_request_error", message, param, code);
}

/** Any thrown value as an {@link ApiError}: E_ARG → 400, other TpErrors and the rest → 500. */
export function apiError(e: unknown): ApiError {
  if (e instanceof ApiError) return e;
  if (e instanceof TpError) {
    if (e.code === "E_ARG") return badRequest(e.message, null, e.code);
    return new ApiError(500, "server_error", e.message, null, e.code);
  }
  return new ApiError(500, "server_error", e instanceof Error ? e.message : String(e));
}

/** A JSON response with the OpenAI error body. */
export function errorResponse(e: ApiError, headers: Record<string, string> = {}): Response {
  return Response.json(e.body(), { status: e.status, headers });
}
