// wb's TypeScript SDK: new Wb({url, apiKey}) and its calls. README.md, "TypeScript SDK".
import { toCamel } from "./case.js";
import { Transport, type CallOptions, type WbOptions } from "./http.js";
import { Runs } from "./runs.js";
import { Sessions } from "./sessions.js";
import type { Deleted, List, Page, Snapshot, Template } from "./types.js";
import { verifyWebhook } from "./webhooks.js";

export { WbError, type WbErrorType } from "./errors.js";
export type { CallOptions, WbOptions } from "./http.js";
export type { Pty } from "./pty.js";
export { camelCase, snakeCase, toCamel, toSnake, type Camelize } from "./case.js";
export {
  verifyWebhook,
  webhookToleranceS,
  WebhookVerificationError,
  type WebhookEvent,
  type WebhookHeaders,
} from "./webhooks.js";
export type * from "./types.js";
export type { components, paths, operations } from "./openapi.js";
export { Runs } from "./runs.js";
export { Files, Sessions } from "./sessions.js";

/** wb.snapshots. */
export class Snapshots {
  readonly #t: Transport;
  constructor(t: Transport) {
    this.#t = t;
  }
  async get(id: string, opts: CallOptions = {}): Promise<Snapshot> {
    return toCamel(await this.#t.json({ method: "GET", path: "/v1/snapshots/" + encodeURIComponent(id), ...opts })) as Snapshot;
  }
  /** One page of the project's snapshots, newest first. */
  async list(page: Page = {}, opts: CallOptions = {}): Promise<List<Snapshot>> {
    return toCamel(await this.#t.json({ method: "GET", path: "/v1/snapshots", query: { ...page }, ...opts })) as List<Snapshot>;
  }
  async delete(id: string, opts: CallOptions = {}): Promise<Deleted> {
    return toCamel(await this.#t.json({ method: "DELETE", path: "/v1/snapshots/" + encodeURIComponent(id), ...opts })) as Deleted;
  }
}

/** wb.templates. */
export class Templates {
  readonly #t: Transport;
  constructor(t: Transport) {
    this.#t = t;
  }
  /** The template catalog, with each template's runtimes for ephemeral runs. */
  async list(opts: CallOptions = {}): Promise<List<Template>> {
    return toCamel(await this.#t.json({ method: "GET", path: "/v1/templates", ...opts })) as List<Template>;
  }
}

/** A client of one wb deployment with one project's API key. */
export class Wb {
  readonly sessions: Sessions;
  readonly runs: Runs;
  readonly snapshots: Snapshots;
  readonly templates: Templates;
  readonly webhooks = {
    /** Verifies a delivery (Standard Webhooks) and answers its event; see verifyWebhook. */
    verify: verifyWebhook,
  };

  /** url and apiKey default to WB_URL and WB_API_KEY. */
  constructor(opts: WbOptions = {}) {
    const t = new Transport(opts);
    this.sessions = new Sessions(t);
    this.runs = new Runs(t);
    this.snapshots = new Snapshots(t);
    this.templates = new Templates(t);
  }
}

export default Wb;
