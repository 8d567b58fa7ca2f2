// One deployment's HTTP calls: authentication, idempotency keys, retries with backoff.
import { randomBytes } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import { errorFromAnswer, WbError } from "./errors.js";

/** How a client reaches a deployment. */
export interface WbOptions {
  /** The deployment's base URL without /v1, e.g. https://wb.example.com. Default: WB_URL. */
  url?: string;
  /** The project's API key. Default: WB_API_KEY. */
  apiKey?: string;
  /** Attempts a call makes at most when answered 429 or 503 (1: no retry). Default 4. */
  maxAttempts?: number;
  /** The first backoff delay, doubled per attempt up to maxDelayMs, ±25 % jitter. Default 500. */
  baseDelayMs?: number;
  /** The longest backoff delay. Default 30000. A Retry-After header wins over both. */
  maxDelayMs?: number;
  /** Sends the requests (default: Node's fetch). */
  fetch?: typeof fetch;
}

/** Options every call takes. */
export interface CallOptions {
  /** Aborts the call, including its waits between retries. */
  signal?: AbortSignal;
}

export type Query = Record<string, string | number | boolean | undefined>;

/** One logical call: its retried attempts share the idempotency key. */
export interface Call extends CallOptions {
  method: "GET" | "POST" | "PUT" | "PATCH" | "DELETE";
  path: string; // below the base URL, e.g. /v1/sessions
  query?: Query | undefined;
  json?: unknown; // a body already in the API's snake_case
  raw?: Uint8Array | string; // a body that is not JSON, sent as contentType
  contentType?: string;
  accept?: string;
}

export class Transport {
  readonly baseUrl: URL;
  readonly apiKey: string;
  readonly #fetch: typeof fetch;
  readonly #maxAttempts: number;
  readonly #baseDelayMs: number;
  readonly #maxDelayMs: number;

  constructor(opts: WbOptions = {}) {
    const url = opts.url ?? process.env["WB_URL"];
    const apiKey = opts.apiKey ?? process.env["WB_API_KEY"];
    if (!url) {
      throw new TypeError("wb: url is empty: give the deployment's URL (new Wb({url}) or WB_URL)");
    }
    let base: URL;
    try {
      base = new URL(url.replace(/\/+$/, ""));
    } catch {
      throw new TypeError(`wb: url ${JSON.stringify(url)}: want an absolute http or https URL such as https://wb.example.com`);
    }
    if (base.protocol !== "http:" && base.protocol !== "https:") {
      throw new TypeError(`wb: url ${JSON.stringify(url)}: want an absolute http or https URL such as https://wb.example.com`);
    }
    if (!apiKey) {
      throw new TypeError("wb: apiKey is empty: give the project's API key (new Wb({apiKey}) or WB_API_KEY)");
    }
    this.baseUrl = base;
    this.apiKey = apiKey;
    this.#fetch = opts.fetch ?? fetch;
    this.#maxAttempts = Math.max(1, opts.maxAttempts ?? 4);
    this.#baseDelayMs = opts.baseDelayMs ?? 500;
    this.#maxDelayMs = opts.maxDelayMs ?? 30_000;
  }

  /** The absolute URL of path with query (undefined values left out). */
  url(path: string, query?: Query): URL {
    const u = new URL(this.baseUrl.href);
    u.pathname = this.baseUrl.pathname.replace(/\/$/, "") + path;
    for (const [k, v] of Object.entries(query ?? {})) {
      if (v !== undefined) {
        u.searchParams.set(k, String(v));
      }
    }
    return u;
  }

  /**
   * Makes the call, retrying answers 429 and 503 (after Retry-After when given, else with
   * backoff), and answers the first response below 400; an error answer throws WbError.
   */
  async send(call: Call): Promise<Response> {
    // A POST carries a key so that a retried create is created once (API.md, Conventions).
    const key = call.method === "POST" ? randomBytes(16).toString("hex") : undefined;
    const body = call.json !== undefined ? JSON.stringify(call.json) : call.raw;
    const headers: Record<string, string> = {
      authorization: `Bearer ${this.apiKey}`,
      accept: call.accept ?? "application/json",
      "user-agent": "wb-ts-sdk",
    };
    if (body !== undefined) {
      headers["content-type"] = call.json !== undefined ? "application/json" : (call.contentType ?? "application/octet-stream");
    }
    if (key) {
      headers["idempotency-key"] = key;
    }
    const url = this.url(call.path, call.query);
    for (let attempt = 1; ; attempt++) {
      const init: RequestInit = { method: call.method, headers };
      if (body !== undefined) {
        init.body = body;
      }
      if (call.signal) {
        init.signal = call.signal;
      }
      const resp = await this.#fetch(url, init);
      if (resp.status < 400) {
        return resp;
      }
      const err = errorFromAnswer(resp.status, resp.headers, await resp.text());
      if ((resp.status !== 429 && resp.status !== 503) || attempt >= this.#maxAttempts) {
        throw err;
      }
      await delay(err.retryAfterMs ?? this.backoffMs(attempt), call.signal);
    }
  }

  /** The delay before attempt+1: base·2^(attempt−1), capped, ±25 % so that callers do not retry in step. */
  backoffMs(attempt: number): number {
    const d = Math.min(this.#baseDelayMs * 2 ** Math.min(attempt - 1, 16), this.#maxDelayMs);
    return d * (0.75 + Math.random() / 2);
  }

  /** Sends a call and answers its JSON body (undefined for an empty one). */
  async json(call: Call): Promise<unknown> {
    const resp = await this.send(call);
    const text = await resp.text();
    if (text.trim() === "") {
      return undefined;
    }
    try {
      return JSON.parse(text);
    } catch {
      throw new WbError({
        status: resp.status,
        type: "api_error",
        code: "unexpected_answer",
        message: `${call.method} ${call.path} answered a body that is not JSON: ${text.slice(0, 200)}`,
      });
    }
  }
}

/** The path of a session. */
export function sessionPath(id: string): string {
  return "/v1/sessions/" + encodeURIComponent(id);
}

/** Waits ms; an abort throws the signal's reason, as fetch does. */
export async function delay(ms: number, signal: AbortSignal | undefined): Promise<void> {
  try {
    await sleep(ms, undefined, signal ? { signal } : {});
  } catch (e) {
    throw signal?.aborted ? signal.reason : e;
  }
}
