// A terminal in a session over the API's WebSocket (the `ws` package: Node 20 has no WebSocket
// client that can send the Authorization header).
import type { IncomingMessage } from "node:http";
import WebSocket from "ws";
import { errorFromAnswer } from "./errors.js";
import { sessionPath, type CallOptions, type Transport } from "./http.js";
import type { PtyParams } from "./types.js";

/**
 * A terminal: iterate it for the output's bytes (the iteration ends when the terminal closes),
 * write() keystrokes, resize() it; `exit` resolves to the process's exit code, or null when the
 * terminal closed without one.
 */
export class Pty implements AsyncIterable<Buffer> {
  readonly #ws: WebSocket;
  readonly #output: Buffer[] = [];
  #wake: (() => void) | undefined;
  #closed = false;
  #error: Error | undefined;
  #exitCode: number | null = null;
  /** The process's exit code once the terminal closed; null when it closed without one. */
  readonly exit: Promise<number | null>;

  constructor(ws: WebSocket) {
    this.#ws = ws;
    this.exit = new Promise((resolve) => {
      ws.on("close", () => {
        this.#closed = true;
        resolve(this.#exitCode);
        this.#notify();
      });
    });
    ws.on("message", (data: WebSocket.RawData, isBinary: boolean) => {
      const buf = Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data as ArrayBuffer);
      if (isBinary) {
        this.#output.push(buf);
        this.#notify();
        return;
      }
      // A text frame from the guest: {"type":"exit","exit_code":N} before it closes.
      try {
        const m = JSON.parse(buf.toString("utf8")) as { type?: string; exit_code?: number };
        if (m.type === "exit" && typeof m.exit_code === "number") {
          this.#exitCode = m.exit_code;
        }
      } catch {
        // not a message of ours: ignored
      }
    });
    ws.on("error", (err: Error) => {
      this.#error = err;
      this.#notify();
    });
  }

  #notify(): void {
    const wake = this.#wake;
    this.#wake = undefined;
    wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<Buffer> {
    for (;;) {
      const chunk = this.#output.shift();
      if (chunk) {
        yield chunk;
        continue;
      }
      if (this.#error) {
        throw new Error(`wb: pty: ${this.#error.message}`, { cause: this.#error });
      }
      if (this.#closed) {
        return;
      }
      await new Promise<void>((resolve) => (this.#wake = resolve));
    }
  }

  /** Sends keystrokes (any bytes) to the terminal. */
  write(data: string | Uint8Array): void {
    this.#ws.send(typeof data === "string" ? Buffer.from(data, "utf8") : data, { binary: true });
  }

  /** Sets the terminal's size (1–1000 each way). */
  resize(cols: number, rows: number): void {
    for (const [name, v] of [["cols", cols], ["rows", rows]] as const) {
      if (!Number.isInteger(v) || v < 1 || v > 1000) {
        throw new RangeError(`wb: pty resize: ${name} must be an integer 1–1000, got ${v}`);
      }
    }
    this.#ws.send(JSON.stringify({ type: "resize", cols, rows }), { binary: false });
  }

  /** Ends the terminal (the session goes on). */
  close(): void {
    this.#ws.close(1000);
  }
}

/** Opens a terminal; a refused upgrade throws the API's error as WbError. */
export function openPty(t: Transport, id: string, params: PtyParams, opts: CallOptions): Promise<Pty> {
  const u = t.url(sessionPath(id) + "/pty", { cols: params.cols, rows: params.rows, command: params.command });
  u.protocol = u.protocol === "https:" ? "wss:" : "ws:";
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(u, {
      headers: { authorization: `Bearer ${t.apiKey}`, "user-agent": "wb-ts-sdk" },
      maxPayload: 1 << 20,
    });
    const abort = (): void => {
      ws.terminate();
      reject(opts.signal?.reason ?? new Error("wb: pty: aborted"));
    };
    opts.signal?.addEventListener("abort", abort, { once: true });
    const settle = (): void => opts.signal?.removeEventListener("abort", abort);
    ws.once("unexpected-response", (_req, res: IncomingMessage) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        settle();
        const headers = new Headers();
        for (const [k, v] of Object.entries(res.headers)) {
          if (typeof v === "string") {
            headers.set(k, v);
          }
        }
        reject(errorFromAnswer(res.statusCode ?? 0, headers, Buffer.concat(chunks).toString("utf8")));
        ws.terminate();
      });
    });
    ws.once("open", () => {
      settle();
      resolve(new Pty(ws));
    });
    ws.once("error", (err: Error) => {
      settle();
      reject(new Error(`wb: open the pty of ${id}: ${err.message}`, { cause: err }));
    });
  });
}
