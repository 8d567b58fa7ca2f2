// Retries, backoff, idempotency keys, error typing, waiting for a starting session and the
// exec stream, against a fake API on 127.0.0.1.
import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";
import { Wb, WbError } from "../src/index.js";
import { parseRetryAfter } from "../src/errors.js";
import { Transport } from "../src/http.js";

interface Seen {
  method: string;
  url: string;
  headers: IncomingMessage["headers"];
  body: string;
}

/** A fake API: handle answers each request; seen records them. */
async function fakeApi(
  handle: (req: Seen, res: ServerResponse, n: number) => void,
): Promise<{ url: string; seen: Seen[]; close: () => Promise<void> }> {
  const seen: Seen[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const s = { method: req.method ?? "", url: req.url ?? "", headers: req.headers, body: Buffer.concat(chunks).toString() };
      seen.push(s);
      handle(s, res, seen.length);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    seen,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

function json(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  res.writeHead(status, { "content-type": "application/json", ...headers });
  res.end(JSON.stringify(body));
}

const busy = { error: { type: "rate_limited", code: "concurrency_limit", message: "too many sessions" } };
const session = (state: string) => ({ id: "sess_1", object: "session", state, tier: 2, idle_timeout_s: 120 });

test("a create retried on 503 and 429 carries one Idempotency-Key and snake_case; the answer reads in camelCase", async (t) => {
  const api = await fakeApi((_req, res, n) => {
    if (n === 1) return json(res, 503, busy);
    if (n === 2) return json(res, 429, busy, { "retry-after": "0" });
    json(res, 201, session("pending"));
  });
  t.after(api.close);
  const wb = new Wb({ url: api.url, apiKey: "key_1", baseDelayMs: 5 });
  const s = await wb.sessions.create({ tier: 2, idleTimeoutS: 120, restoreFrom: "snap_1" });
  assert.equal(s.idleTimeoutS, 120);
  assert.equal(api.seen.length, 3);
  const keys = new Set(api.seen.map((r) => r.headers["idempotency-key"]));
  assert.equal(keys.size, 1, "every attempt of one create sends the same key");
  assert.match(String([...keys][0]), /^[0-9a-f]{32}$/);
  for (const r of api.seen) {
    assert.equal(r.headers.authorization, "Bearer key_1");
    assert.deepEqual(JSON.parse(r.body), { tier: 2, idle_timeout_s: 120, restore_from: "snap_1" });
    assert.equal(r.url, "/v1/sessions");
  }
  await wb.sessions.create({ tier: 2 });
  assert.notEqual(api.seen[3]?.headers["idempotency-key"], api.seen[0]?.headers["idempotency-key"], "another call, another key");
  await wb.sessions.get("sess_1");
  assert.equal(api.seen[4]?.headers["idempotency-key"], undefined, "a GET has no key");
});

test("Retry-After is honoured over the backoff", async (t) => {
  const api = await fakeApi((_req, res, n) => (n === 1 ? json(res, 429, busy, { "retry-after": "1" }) : json(res, 200, session("running"))));
  t.after(api.close);
  const wb = new Wb({ url: api.url, apiKey: "k", baseDelayMs: 1 });
  const start = performance.now();
  await wb.sessions.get("sess_1");
  assert.ok(performance.now() - start >= 950, `retried after ${performance.now() - start} ms, want Retry-After's 1 s`);
  assert.ok((parseRetryAfter(new Date(Date.now() + 30_000).toUTCString()) ?? 0) > 25_000, "an HTTP date");
  assert.equal(parseRetryAfter("soon"), undefined);
});

test("backoff doubles per attempt, with jitter, up to maxDelayMs; the last answer is thrown", async (t) => {
  // The schedule, exactly: base·2^(attempt−1), capped, each within ±25 %.
  const tr = new Transport({ url: "http://127.0.0.1:1", apiKey: "k", baseDelayMs: 100, maxDelayMs: 250 });
  for (const [attempt, want] of [[1, 100], [2, 200], [3, 250], [20, 250]] as const) {
    for (let i = 0; i < 200; i++) {
      const d = tr.backoffMs(attempt);
      assert.ok(d >= want * 0.75 && d <= want * 1.25, `attempt ${attempt}: ${d} ms, want ${want} ±25 %`);
    }
  }
  // The retries, by the clock: never before their delay (a timer does not fire early); the
  // upper bounds are wide, for a loaded machine's late timers.
  const at: number[] = [];
  const api = await fakeApi((_req, res) => {
    at.push(performance.now());
    json(res, 503, { error: { type: "api_error", code: "unavailable", message: "later" } });
  });
  t.after(api.close);
  const wb = new Wb({ url: api.url, apiKey: "k", maxAttempts: 4, baseDelayMs: 100, maxDelayMs: 250 });
  await assert.rejects(wb.sessions.get("sess_1"), (e: unknown) => e instanceof WbError && e.status === 503 && e.code === "unavailable");
  assert.equal(at.length, 4);
  const gaps = at.slice(1).map((t0, i) => t0 - (at[i] ?? 0));
  assert.ok(gaps[0]! >= 70 && gaps[0]! < 2000, `first gap ${gaps[0]}`);
  assert.ok(gaps[1]! >= 145 && gaps[1]! < 2000, `second gap ${gaps[1]}`);
  assert.ok(gaps[2]! >= 180 && gaps[2]! < 2000, `third gap (capped) ${gaps[2]}`);
});

test("errors are WbError with status, type, code, param, message; 4xx is not retried", async (t) => {
  const api = await fakeApi((req, res) => {
    if (req.url.startsWith("/v1/sessions/sess_gone")) {
      return json(res, 404, { error: { type: "not_found", code: "not_found", message: "no session sess_gone" } });
    }
    if (req.url === "/v1/runs") {
      res.writeHead(502, { "content-type": "text/plain" });
      return res.end("bad gateway\n");
    }
    json(res, 400, { error: { type: "invalid_request", code: "out_of_range", message: "idle_timeout_s must be 30–7200", param: "idle_timeout_s" } });
  });
  t.after(api.close);
  const wb = new Wb({ url: api.url, apiKey: "k", baseDelayMs: 1 });
  await assert.rejects(wb.sessions.create({ tier: 2, idleTimeoutS: 1 }), (e: unknown) => {
    assert.ok(e instanceof WbError);
    assert.deepEqual([e.status, e.type, e.code, e.param], [400, "invalid_request", "out_of_range", "idle_timeout_s"]);
    assert.match(e.message, /idle_timeout_s must be 30–7200/);
    return true;
  });
  assert.equal(api.seen.length, 1, "a 400 is not retried");
  await assert.rejects(wb.sessions.get("sess_gone"), (e: unknown) => e instanceof WbError && e.status === 404 && e.type === "not_found" && e.param === undefined);
  await assert.rejects(wb.runs.create({ tier: 1, runtime: "python3", code: "1" }), (e: unknown) =>
    e instanceof WbError && e.status === 502 && e.type === "api_error" && e.code === "unexpected_answer" && e.message.includes("bad gateway"),
  );
});

test("an abort ends the wait between retries", async (t) => {
  const api = await fakeApi((_req, res) => json(res, 429, busy, { "retry-after": "60" }));
  t.after(api.close);
  const wb = new Wb({ url: api.url, apiKey: "k" });
  const start = performance.now();
  await assert.rejects(wb.sessions.get("sess_1", { signal: AbortSignal.timeout(200) }), { name: "TimeoutError" });
  assert.ok(performance.now() - start < 5000);
});

test("url and apiKey come from WB_URL and WB_API_KEY; a missing one is a clear error", () => {
  const saved = { url: process.env["WB_URL"], key: process.env["WB_API_KEY"] };
  try {
    process.env["WB_URL"] = "http://127.0.0.1:9/";
    process.env["WB_API_KEY"] = "envkey";
    assert.doesNotThrow(() => new Wb());
    delete process.env["WB_API_KEY"];
    assert.throws(() => new Wb(), /apiKey is empty.*WB_API_KEY/);
    assert.throws(() => new Wb({ url: "ftp://x", apiKey: "k" }), /absolute http or https URL/);
  } finally {
    for (const [k, v] of [["WB_URL", saved.url], ["WB_API_KEY", saved.key]] as const) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
});

test("a call made while the session starts waits for running, then calls again with a new key", async (t) => {
  let state = "pending";
  const api = await fakeApi((req, res) => {
    if (req.method === "GET") {
      const now = state;
      if (state === "pending") state = "provisioning";
      else if (state === "provisioning") state = "running";
      return json(res, 200, session(now));
    }
    if (state !== "running") {
      return json(res, 409, { error: { type: "invalid_state", code: "invalid_state", message: `session is ${state}; exec needs a running session` } });
    }
    json(res, 200, { exit_code: 0, stdout: "hi\n", stderr: "", duration_ms: 3, truncated: false, stdout_bytes: 3, stderr_bytes: 0 });
  });
  t.after(api.close);
  const wb = new Wb({ url: api.url, apiKey: "k" });
  const r = await wb.sessions.exec("sess_1", { command: "echo hi", timeoutS: 5 });
  assert.deepEqual([r.exitCode, r.stdout, r.durationMs], [0, "hi\n", 3]);
  const posts = api.seen.filter((s) => s.method === "POST");
  assert.equal(posts.length, 2);
  assert.notEqual(posts[0]?.headers["idempotency-key"], posts[1]?.headers["idempotency-key"], "the gateway keeps a 409 under its key");
  assert.deepEqual(JSON.parse(posts[1]!.body), { command: "echo hi", timeout_s: 5 });
});

test("a 409 for a session that is not starting (paused, or refused while running) is thrown", async (t) => {
  let state = "paused";
  const api = await fakeApi((req, res) => {
    if (req.method === "GET") return json(res, 200, session(state));
    json(res, 409, { error: { type: "invalid_state", code: "invalid_state", message: `session is ${state}` } });
  });
  t.after(api.close);
  const wb = new Wb({ url: api.url, apiKey: "k" });
  await assert.rejects(wb.runs.create({ sessionId: "sess_1", command: "true" }), (e: unknown) => e instanceof WbError && e.status === 409);
  assert.equal(api.seen.filter((s) => s.method === "POST").length, 1, "a paused session is not waited for");
  state = "running"; // e.g. pausing a tier-1 session: 409 however often
  await assert.rejects(wb.sessions.pause("sess_1"), (e: unknown) => e instanceof WbError && e.status === 409);
  assert.equal(api.seen.filter((s) => s.method === "POST").length, 3, "one more call when seen running, then thrown");
});

test("execStream yields output (text and base64) then its end; an error line throws WbError; a cut stream throws", async (t) => {
  let mode = "ok";
  const api = await fakeApi((req, res) => {
    assert.equal(req.headers.accept, "application/x-ndjson");
    res.writeHead(200, { "content-type": "application/x-ndjson" });
    res.write('{"stream":"stdout","data":"hel"}\n{"stream":"stderr","data":"/w==","encoding":"base64"}\n');
    if (mode === "ok") res.end('{"stream":"stdout","data":"lo"}\n{"exit_code":3,"duration_ms":7,"timed_out":false}\n');
    else if (mode === "error") res.end('{"error":{"type":"denied","code":"policy_violation","message":"killed by rule x"}}\n');
    else res.end();
  });
  t.after(api.close);
  const wb = new Wb({ url: api.url, apiKey: "k" });
  const events = [];
  for await (const ev of wb.sessions.execStream("sess_1", { command: ["sh", "-c", "x"] })) events.push(ev);
  assert.deepEqual(events, [
    { stream: "stdout", data: Buffer.from("hel") },
    { stream: "stderr", data: Buffer.from([0xff]) },
    { stream: "stdout", data: Buffer.from("lo") },
    { exitCode: 3, durationMs: 7, timedOut: false },
  ]);
  mode = "error";
  await assert.rejects(async () => {
    for await (const _ of wb.sessions.execStream("sess_1", { command: "x" }));
  }, (e: unknown) => e instanceof WbError && e.status === 200 && e.code === "policy_violation");
  mode = "cut";
  await assert.rejects(async () => {
    for await (const _ of wb.sessions.execStream("sess_1", { command: "x" }));
  }, /ended before its last line/);
});
