// wb.runs: one command in a session, or an ephemeral run in a fresh session.
import { toCamel, toSnake } from "./case.js";
import type { CallOptions, Transport } from "./http.js";
import { whenRunning } from "./sessions.js";
import type { CreateRunParams, Run } from "./types.js";

export class Runs {
  readonly #t: Transport;
  constructor(transport: Transport) {
    this.#t = transport;
  }

  /**
   * Runs a command in a session ({sessionId, command}; waits for the session to be running), or
   * an ephemeral run ({tier: 1, runtime, code}); answers once the run ended unless wait: false.
   * A run whose command exited non-zero is not an error: read exitCode.
   */
  async create(params: CreateRunParams, opts: CallOptions = {}): Promise<Run> {
    const { wait, ...body } = params;
    const call = async (): Promise<Run> =>
      toCamel(
        await this.#t.json({
          method: "POST",
          path: "/v1/runs",
          query: { wait: wait === false ? "false" : undefined },
          json: toSnake(body),
          ...opts,
        }),
      ) as Run;
    return "sessionId" in params ? whenRunning(this.#t, params.sessionId, opts, call) : call();
  }

  get(id: string, opts: CallOptions = {}): Promise<Run> {
    return this.#t
      .json({ method: "GET", path: "/v1/runs/" + encodeURIComponent(id), ...opts })
      .then((b) => toCamel(b) as Run);
  }
}
