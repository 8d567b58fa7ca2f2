// wb.sessions: the session's life cycle, exec, files and PTY.
import { toCamel, toSnake } from "./case.js";
import { WbError } from "./errors.js";
import { delay, sessionPath, type CallOptions, type Transport } from "./http.js";
import { openPty, type Pty } from "./pty.js";
import type {
  CreateSessionParams,
  ExecEvent,
  ExecParams,
  ExecResult,
  FileInfo,
  List,
  ListSessionsParams,
  PatchSessionParams,
  PtyParams,
  Session,
  SessionState,
  Snapshot,
  SnapshotParams,
} from "./types.js";

const terminal: ReadonlySet<SessionState> = new Set(["stopped", "failed", "expired"]);

/** States a session leaves for running by itself: a call that needs running waits them out. */
const becomingRunning: ReadonlySet<SessionState> = new Set(["pending", "provisioning", "snapshotting"]);

/**
 * Polls a session until done(session) (100 ms doubling to 2 s between reads) and answers it.
 */
async function poll(
  transport: Transport,
  id: string,
  done: (s: Session) => boolean,
  opts: CallOptions,
): Promise<Session> {
  for (let ms = 100; ; ms = Math.min(ms * 2, 2000)) {
    const s = toCamel(await transport.json({ method: "GET", path: sessionPath(id), ...opts })) as Session;
    if (done(s)) {
      return s;
    }
    await delay(ms, opts.signal);
  }
}

/**
 * Makes a call that needs session id running. Created sessions answer in pending: a call
 * made before the session is running (the seed's "pre-warm during inference" makes one right
 * after the create) is answered 409 and changed nothing, so it waits for the session to leave
 * pending, provisioning or snapshotting and calls again (with a new idempotency key: the
 * gateway keeps a 409 under the first). Any other 409 is thrown as it is.
 */
export async function whenRunning<T>(
  transport: Transport,
  id: string,
  opts: CallOptions,
  call: () => Promise<T>,
): Promise<T> {
  // A session seen running right after its 409 may have started meanwhile: one more call. A
  // second such 409 was for another reason (a tier-1 pause): thrown.
  let calledWhileRunning = false;
  for (;;) {
    try {
      return await call();
    } catch (e) {
      if (!(e instanceof WbError) || e.status !== 409 || e.type !== "invalid_state") {
        throw e;
      }
      let wasBecoming = false;
      const s = await poll(transport, id, (s) => {
        wasBecoming ||= becomingRunning.has(s.state);
        return !becomingRunning.has(s.state);
      }, opts);
      if (s.state !== "running" || (!wasBecoming && calledWhileRunning)) {
        throw e; // paused, stopping or ended, or refused while running: the caller's to handle
      }
      calledWhileRunning ||= !wasBecoming;
    }
  }
}

/** wb.sessions.files: a running session's files. */
export class Files {
  readonly #t: Transport;
  constructor(transport: Transport) {
    this.#t = transport;
  }

  /** Writes content to path (at most 100 MiB), replacing the file. */
  async write(sessionId: string, path: string, content: string | Uint8Array, opts: CallOptions = {}): Promise<void> {
    await whenRunning(this.#t, sessionId, opts, () =>
      this.#t.send({ method: "PUT", path: sessionPath(sessionId) + "/files", query: { path }, raw: content, ...opts }),
    ).then((resp) => resp.body?.cancel());
  }

  /** Answers a whole file. */
  async read(sessionId: string, path: string, opts: CallOptions = {}): Promise<Buffer> {
    const resp = await whenRunning(this.#t, sessionId, opts, () =>
      this.#t.send({
        method: "GET",
        path: sessionPath(sessionId) + "/files",
        query: { path },
        accept: "application/octet-stream",
        ...opts,
      }),
    );
    return Buffer.from(await resp.arrayBuffer());
  }

  /** Lists a directory, sorted by name. */
  async list(sessionId: string, dir: string, opts: CallOptions = {}): Promise<List<FileInfo>> {
    const body = await whenRunning(this.#t, sessionId, opts, () =>
      this.#t.json({ method: "GET", path: sessionPath(sessionId) + "/files", query: { path: dir, list: 1 }, ...opts }),
    );
    return toCamel(body) as List<FileInfo>;
  }

  /** Removes a file. */
  async delete(sessionId: string, path: string, opts: CallOptions = {}): Promise<void> {
    await whenRunning(this.#t, sessionId, opts, () =>
      this.#t.send({ method: "DELETE", path: sessionPath(sessionId) + "/files", query: { path }, ...opts }),
    ).then((resp) => resp.body?.cancel());
  }
}

/** wb.sessions. */
export class Sessions {
  readonly #t: Transport;
  readonly files: Files;

  constructor(transport: Transport) {
    this.#t = transport;
    this.files = new Files(transport);
  }

  async #session(call: Parameters<Transport["json"]>[0]): Promise<Session> {
    return toCamel(await this.#t.json(call)) as Session;
  }

  /**
   * Starts a session: answered at once, in pending. Calls that need it running (exec, runs,
   * files, snapshot, pause, pty) wait for it; wait() awaits it explicitly. With restoreFrom, a
   * new session from a ready snapshot.
   */
  create(params: CreateSessionParams, opts: CallOptions = {}): Promise<Session> {
    return this.#session({ method: "POST", path: "/v1/sessions", json: toSnake(params), ...opts });
  }

  get(id: string, opts: CallOptions = {}): Promise<Session> {
    return this.#session({ method: "GET", path: sessionPath(id), ...opts });
  }

  /** One page of the project's sessions, newest first. */
  async list(params: ListSessionsParams = {}, opts: CallOptions = {}): Promise<List<Session>> {
    const query = toSnake(params) as Record<string, string | number | undefined>;
    return toCamel(await this.#t.json({ method: "GET", path: "/v1/sessions", query, ...opts })) as List<Session>;
  }

  /** Changes a session's timers (idleTimeoutS, maxLifetimeS). */
  patch(id: string, params: PatchSessionParams, opts: CallOptions = {}): Promise<Session> {
    return this.#session({ method: "PATCH", path: sessionPath(id), json: toSnake(params), ...opts });
  }

  /** Stops a session: answers it in stopping (or as it is, once stopped). Idempotent. */
  delete(id: string, opts: CallOptions = {}): Promise<Session> {
    return this.#session({ method: "DELETE", path: sessionPath(id), ...opts });
  }

  /** Pauses a running session (tier 2 and up). */
  pause(id: string, opts: CallOptions = {}): Promise<Session> {
    return whenRunning(this.#t, id, opts, () =>
      this.#session({ method: "POST", path: sessionPath(id) + ":pause", json: {}, ...opts }),
    );
  }

  /** Resumes a paused session. */
  resume(id: string, opts: CallOptions = {}): Promise<Session> {
    return this.#session({ method: "POST", path: sessionPath(id) + ":resume", json: {}, ...opts });
  }

  /** Snapshots a running session; restore it with create({restoreFrom: snapshot.id}). */
  async snapshot(id: string, params: SnapshotParams = {}, opts: CallOptions = {}): Promise<Snapshot> {
    const body = await whenRunning(this.#t, id, opts, () =>
      this.#t.json({ method: "POST", path: sessionPath(id) + ":snapshot", json: toSnake(params), ...opts }),
    );
    return toCamel(body) as Snapshot;
  }

  /**
   * Runs a command and answers its result (each stream kept up to 8 MiB; past that truncated,
   * with the full byte counts). A non-zero exit is not an error. execStream does not truncate.
   */
  async exec(id: string, params: ExecParams, opts: CallOptions = {}): Promise<ExecResult> {
    const body = await whenRunning(this.#t, id, opts, () =>
      this.#t.json({ method: "POST", path: sessionPath(id) + "/exec", json: toSnake(params), ...opts }),
    );
    return toCamel(body) as ExecResult;
  }

  /**
   * Runs a command and yields its output as it comes (NDJSON), then its end. A failure after the
   * output started throws WbError with status 200; a stream cut before its end throws.
   */
  async *execStream(id: string, params: ExecParams, opts: CallOptions = {}): AsyncGenerator<ExecEvent> {
    const resp = await whenRunning(this.#t, id, opts, () =>
      this.#t.send({
        method: "POST",
        path: sessionPath(id) + "/exec",
        json: toSnake(params),
        accept: "application/x-ndjson",
        ...opts,
      }),
    );
    const ct = resp.headers.get("content-type") ?? "";
    if (!ct.startsWith("application/x-ndjson") || !resp.body) {
      await resp.body?.cancel();
      throw new Error(`wb: exec answered ${ct || "no body"}, not a stream (application/x-ndjson)`);
    }
    const decoder = new TextDecoder();
    let buffered = "";
    for await (const chunk of resp.body) {
      buffered += decoder.decode(chunk, { stream: true });
      let nl: number;
      while ((nl = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, nl).trim();
        buffered = buffered.slice(nl + 1);
        if (line === "") {
          continue;
        }
        const ev = parseExecLine(line);
        yield ev;
        if ("exitCode" in ev) {
          return; // leaving the loop cancels the body
        }
      }
    }
    throw new Error("wb: the exec stream ended before its last line");
  }

  /** Opens a terminal over the API's WebSocket; close() ends it (the session goes on). */
  pty(id: string, params: PtyParams = {}, opts: CallOptions = {}): Promise<Pty> {
    return whenRunning(this.#t, id, opts, () => openPty(this.#t, id, params, opts));
  }

  /**
   * Polls a session until it is in one of the states `until` (default running) and answers it;
   * throws when it ended (stopped, failed, expired) otherwise.
   */
  async wait(
    id: string,
    params: { until?: SessionState | SessionState[] } = {},
    opts: CallOptions = {},
  ): Promise<Session> {
    const until = new Set([params.until ?? "running"].flat());
    const s = await poll(this.#t, id, (s) => until.has(s.state) || terminal.has(s.state), opts);
    if (!until.has(s.state)) {
      throw new Error(
        `wb: session ${id} is ${s.state}${s.stateReason ? ` (${s.stateReason})` : ""}, never ${[...until].join(" or ")}`,
      );
    }
    return s;
  }
}

/** One NDJSON line of a streamed exec: output, the end, or an error. */
export function parseExecLine(line: string): ExecEvent {
  let l: Record<string, unknown>;
  try {
    l = JSON.parse(line) as Record<string, unknown>;
  } catch {
    throw new Error(`wb: exec stream: a line that is not JSON: ${line.slice(0, 200)}`);
  }
  const e = l["error"] as Record<string, unknown> | undefined;
  if (e && typeof e === "object") {
    throw new WbError({
      status: 200, // the stream had started: the status was 200
      type: String(e["type"] ?? "api_error"),
      code: String(e["code"] ?? "exec_failed"),
      message: String(e["message"] ?? line),
      param: typeof e["param"] === "string" ? e["param"] : undefined,
    });
  }
  if (typeof l["exit_code"] === "number") {
    return {
      exitCode: l["exit_code"],
      durationMs: typeof l["duration_ms"] === "number" ? l["duration_ms"] : 0,
      timedOut: l["timed_out"] === true,
    };
  }
  if ((l["stream"] === "stdout" || l["stream"] === "stderr") && typeof l["data"] === "string") {
    const data = l["encoding"] === "base64" ? Buffer.from(l["data"], "base64") : Buffer.from(l["data"], "utf8");
    return { stream: l["stream"], data };
  }
  throw new Error(`wb: exec stream: a line that is neither output, end nor error: ${line.slice(0, 200)}`);
}
