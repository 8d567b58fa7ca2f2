// The API's error answers as one typed error.

/** The `type` of an error answer (API.md, Conventions). */
export type WbErrorType =
  | "invalid_request"
  | "unauthenticated"
  | "denied"
  | "not_found"
  | "invalid_state"
  | "idempotency_error"
  | "rate_limited"
  | "api_error"
  | "spend_cap_reached";

/**
 * An error answer of the API: its HTTP status and the body's `{error: {type, code, message,
 * param}}`. An answer whose body is not such an object is type "api_error", code
 * "unexpected_answer", with the body as its message. A failure after a streamed exec started
 * has status 200.
 */
export class WbError extends Error {
  override readonly name = "WbError";
  readonly status: number;
  readonly type: WbErrorType | string;
  readonly code: string;
  readonly param: string | undefined;
  /** The answer's Retry-After in milliseconds, when it had one (429, 503). */
  readonly retryAfterMs: number | undefined;

  constructor(fields: {
    status: number;
    type: string;
    code: string;
    message: string;
    param?: string | undefined;
    retryAfterMs?: number | undefined;
  }) {
    super(
      `wb: ${fields.status} ${fields.type}/${fields.code}: ${fields.message}` +
        (fields.param ? ` (param ${fields.param})` : ""),
    );
    this.status = fields.status;
    this.type = fields.type;
    this.code = fields.code;
    this.param = fields.param;
    this.retryAfterMs = fields.retryAfterMs;
  }
}

/** Reads `{error: {...}}` from a body, or undefined when it is not one. */
export function errorDetail(
  body: unknown,
): { type: string; code: string; message: string; param?: string } | undefined {
  if (body === null || typeof body !== "object" || !("error" in body)) {
    return undefined;
  }
  const e = (body as { error: unknown }).error;
  if (e === null || typeof e !== "object") {
    return undefined;
  }
  const { type, code, message, param } = e as Record<string, unknown>;
  if (typeof type !== "string" || typeof code !== "string" || typeof message !== "string") {
    return undefined;
  }
  return typeof param === "string" ? { type, code, message, param } : { type, code, message };
}

/** The WbError of an answer's status, headers and body text. */
export function errorFromAnswer(status: number, headers: Headers, text: string): WbError {
  const retryAfterMs = parseRetryAfter(headers.get("retry-after"));
  let detail: ReturnType<typeof errorDetail>;
  try {
    detail = errorDetail(JSON.parse(text));
  } catch {
    detail = undefined;
  }
  if (detail) {
    return new WbError({ status, ...detail, retryAfterMs });
  }
  return new WbError({
    status,
    type: "api_error",
    code: "unexpected_answer",
    message: text.trim() || `HTTP ${status}`,
    retryAfterMs,
  });
}

/** Retry-After as delay-seconds or an HTTP date, in milliseconds; undefined when absent or unreadable. */
export function parseRetryAfter(value: string | null, now: number = Date.now()): number | undefined {
  if (value === null || value.trim() === "") {
    return undefined;
  }
  if (/^\d+$/.test(value.trim())) {
    return Number(value.trim()) * 1000;
  }
  const at = Date.parse(value);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}
