// Seed 000's four patterns ("Patterns"), written as the seed writes them, against a real
// `wb serve` with runc guests; then files and the PTY on the same server.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { Wb, WbError, type Session } from "../src/index.js";
import { skipReason, startServe, type Server } from "./serve.js";

const skip = skipReason();
if (skip) {
  console.log(`# skipping the tests against wb serve: ${skip}`);
}

/** A model whose plan takes a while, as inference does. */
const model = {
  async plan(userRequest: string): Promise<{ command: string }> {
    await sleep(300);
    return { command: `echo "${userRequest}: $((6*7))"` };
  },
};

describe("seed 000 patterns against wb serve", { skip, timeout: 20 * 60_000 }, () => {
  let server: Server;
  let wb: Wb;

  before(async () => {
    server = await startServe();
    wb = new Wb({ url: server.url, apiKey: server.apiKey });
  }, { timeout: 15 * 60_000 }); // a cold build of wb and its agent when WB_TEST_BIN is unset

  after(async () => {
    await server?.stop();
  });

  /** Awaits a session's stop, and answers it. */
  async function stopped(id: string): Promise<Session> {
    return wb.sessions.wait(id, { until: ["stopping", "stopped"] });
  }

  /** Asserts that a session was deleted: DELETE answers it in stopping, so no wait. */
  async function assertDeleted(id: string, why: string): Promise<void> {
    const s = await wb.sessions.get(id);
    assert.ok(s.state === "stopping" || s.state === "stopped", `${why}: session ${id} is ${s.state}`);
    assert.equal(s.stateReason, "deleted", why);
  }

  test("Pre-warm during inference", { timeout: 180_000 }, async (t) => {
    const userRequest = "the answer";
    // --- as the seed writes it
    const [plan, session] = await Promise.all([
      model.plan(userRequest),
      wb.sessions.create({ tier: 2, template: "tpl_dev_polyglot" }),
    ]);
    // provisioning overlapped the inference; the session is usually already running
    const result = await wb.sessions.exec(session.id, { command: plan.command });
    // ---
    t.after(() => wb.sessions.delete(session.id).then(() => undefined));
    assert.equal(session.state, "pending", "create answers at once, before the session runs");
    assert.match(session.template, /^tpl_dev_polyglot@sha256:/);
    assert.equal(result.exitCode, 0, `stderr: ${result.stderr}`);
    assert.equal(result.stdout, "the answer: 42\n");
  });

  test("Snapshot between turns", { timeout: 180_000 }, async () => {
    const store = new Map<string, string>();
    const conversationId = "conv_1";
    const first = await wb.sessions.create({ tier: 2 });
    const wrote = await wb.sessions.exec(first.id, { command: "echo 'turn one' > /workspace/notes.txt" });
    assert.equal(wrote.exitCode, 0, wrote.stderr);
    const snapId = await (async (session: Session) => {
      // --- as the seed writes it: end of turn
      const snap = await wb.sessions.snapshot(session.id, { includeMemory: true });
      await wb.sessions.delete(session.id);
      await store.set(conversationId, snap.id);
      // ---
      assert.equal(snap.state, "ready");
      assert.equal(snap.sessionId, session.id);
      return snap.id;
    })(first);
    await assertDeleted(first.id, "the end of the turn deleted the session");

    // --- as the seed writes it: start of the next turn, minutes or days later
    const session = await wb.sessions.create({ tier: 2, restoreFrom: await store.get(conversationId) });
    // ---
    try {
      assert.notEqual(session.id, first.id, "a restore is a new session");
      const notes = await wb.sessions.exec(session.id, { command: "cat /workspace/notes.txt" });
      assert.equal(notes.stdout, "turn one\n", "the workspace came back from the snapshot");
      assert.equal(store.get(conversationId), snapId);
    } finally {
      await wb.sessions.delete(session.id);
    }
  });

  /** The seed's pattern, word for word, as a function of the plan; created records the session. */
  async function oneSessionManyRuns(plan: { steps: { command: string }[] }, created: Session[], runs: unknown[]): Promise<void> {
    const session = await wb.sessions.create({ tier: 2, idleTimeoutS: 120 });
    created.push(session);
    try {
      for (const step of plan.steps) {
        const run = await wb.runs.create({ sessionId: session.id, command: step.command });
        runs.push(run);
        if (run.exitCode !== 0) break;
      }
    } finally {
      await wb.sessions.delete(session.id); // always, even on throw
    }
  }

  test("One session, many runs: the loop stops at a failed step, and the finally deletes the session", { timeout: 180_000 }, async () => {
    const created: Session[] = [];
    const runs: { exitCode: number | null; stdout: string; sessionId: string | null }[] = [];
    const plan = {
      steps: [
        { command: "echo one >> /workspace/log; cat /workspace/log" },
        { command: "echo two >> /workspace/log; cat /workspace/log" },
        { command: "exit 7" },
        { command: "echo never" },
      ],
    };
    await oneSessionManyRuns(plan, created, runs);
    const [session] = created;
    assert.ok(session);
    assert.equal(session.idleTimeoutS, 120);
    assert.deepEqual(runs.map((r) => r.exitCode), [0, 0, 7], "the loop breaks at the first non-zero exit");
    assert.equal(runs[1]?.stdout, "one\ntwo\n", "the runs share one workspace");
    assert.ok(runs.every((r) => r.sessionId === session.id));
    await assertDeleted(session.id, "the finally deleted the session");
  });

  test("One session, many runs: when a step throws, the finally still deletes the session", { timeout: 180_000 }, async () => {
    const created: Session[] = [];
    const runs: unknown[] = [];
    // The second step's command is empty: the API refuses it (400), so runs.create throws.
    const plan = { steps: [{ command: "true" }, { command: "" }, { command: "echo never" }] };
    await assert.rejects(oneSessionManyRuns(plan, created, runs), (e: unknown) => {
      assert.ok(e instanceof WbError, String(e));
      assert.equal(e.status, 400);
      assert.equal(e.type, "invalid_request");
      return true;
    });
    assert.equal(runs.length, 1);
    const [session] = created;
    assert.ok(session);
    await assertDeleted(session.id, "the finally deleted the session although a step threw");
  });

  test("Ephemeral isolation per call", { timeout: 180_000 }, async (t) => {
    // The seed writes runtime 'python3.12', a python by its version: ask for this host's
    // python3 so, by the version GET /v1/templates shows ("3.11.2" → "python3.11").
    const templates = (await wb.templates.list()).data;
    const version = templates.map((tpl) => tpl.runtimeVersions?.["python3"]).find((v) => v);
    if (!version) {
      const runtimes = templates.flatMap((tpl) => tpl.runtimes ?? []);
      t.skip(`no python3 of a known version on this host (runtimes: ${runtimes.join(", ")})`);
      return;
    }
    const python = "python" + version.split(".").slice(0, 2).join(".");
    // Each candidate leaves a mark and reports whether it found another's.
    const candidates = [1, 2, 3].map((n) => ({
      code: `import os\np = "/workspace/mark"\nseen = os.path.exists(p)\nopen(p, "w").write("${n}")\nprint(${n}, seen)`,
    }));
    // --- as the seed writes it (runtime: see above)
    const results = await Promise.all(
      candidates.map((c) => wb.runs.create({ tier: 1, runtime: python, code: c.code })),
    );
    // ---
    assert.deepEqual(results.map((r) => [r.state, r.exitCode, r.stdout]), [
      ["succeeded", 0, "1 False\n"],
      ["succeeded", 0, "2 False\n"],
      ["succeeded", 0, "3 False\n"],
    ], `no run saw another's file (errors: ${JSON.stringify(results.map((r) => r.error))})`);
    const sessions = new Set(results.map((r) => r.sessionId));
    assert.equal(sessions.size, 3, "a fresh session per run");
    for (const id of sessions) {
      assert.ok(id);
      const s = await stopped(id);
      assert.equal(s.tier, 1);
    }
  });

  test("life cycle: wait, patch, list, pause, resume, execStream, errors", { timeout: 180_000 }, async () => {
    const created = await wb.sessions.create({ tier: 2, metadata: { ticket_id: "T-1" } });
    try {
      const running = await wb.sessions.wait(created.id);
      assert.equal(running.state, "running");
      assert.deepEqual(running.metadata, { ticket_id: "T-1" }, "metadata keys pass as given, both ways");
      const patched = await wb.sessions.patch(created.id, { idleTimeoutS: 600 });
      assert.equal(patched.idleTimeoutS, 600);
      const listed = await wb.sessions.list({ state: "running", limit: 100 });
      assert.ok(listed.data.some((s) => s.id === created.id), "list answers the running session");
      assert.equal((await wb.sessions.pause(created.id)).state, "paused");
      await assert.rejects(wb.sessions.exec(created.id, { command: "true" }), (e: unknown) =>
        e instanceof WbError && e.status === 409 && e.type === "invalid_state" && /paused/.test(e.message),
      );
      assert.equal((await wb.sessions.resume(created.id)).state, "running");
      const events = [];
      for await (const ev of wb.sessions.execStream(created.id, { command: "echo out; echo err >&2; exit 4" })) {
        events.push("exitCode" in ev ? { exitCode: ev.exitCode } : { [ev.stream]: ev.data.toString() });
      }
      assert.deepEqual(events.filter((e) => "stdout" in e), [{ stdout: "out\n" }]);
      assert.deepEqual(events.filter((e) => "stderr" in e), [{ stderr: "err\n" }]);
      assert.deepEqual(events.at(-1), { exitCode: 4 });
      await assert.rejects(wb.sessions.get("sess_nope"), (e: unknown) => e instanceof WbError && e.status === 404 && e.type === "not_found");
      await assert.rejects(wb.sessions.pty("sess_nope"), (e: unknown) => e instanceof WbError && e.status === 404);
      await assert.rejects(wb.sessions.create({ tier: 2, idleTimeoutS: 1 }), (e: unknown) =>
        e instanceof WbError && e.status === 400 && e.param === "idle_timeout_s",
      );
    } finally {
      await wb.sessions.delete(created.id);
    }
  });

  test("files: write, read, list, delete", { timeout: 180_000 }, async () => {
    const session = await wb.sessions.create({ tier: 2 });
    try {
      const bytes = Buffer.from([0, 1, 2, 255, 10]);
      await wb.sessions.files.write(session.id, "/workspace/dir/blob.bin", bytes);
      await wb.sessions.files.write(session.id, "/workspace/dir/a.txt", "hello\n");
      assert.deepEqual(await wb.sessions.files.read(session.id, "/workspace/dir/blob.bin"), bytes);
      const list = await wb.sessions.files.list(session.id, "/workspace/dir/");
      assert.deepEqual(list.data.map((f) => [f.name, f.size, f.isDir]), [["a.txt", 6, false], ["blob.bin", 5, false]]);
      await wb.sessions.files.delete(session.id, "/workspace/dir/a.txt");
      await assert.rejects(wb.sessions.files.read(session.id, "/workspace/dir/a.txt"), (e: unknown) => e instanceof WbError && e.status === 404);
    } finally {
      await wb.sessions.delete(session.id);
    }
  });

  test("pty: output comes back, a resize reaches the terminal, the exit code is the shell's", { timeout: 180_000 }, async () => {
    const session = await wb.sessions.create({ tier: 2 });
    try {
      const pty = await wb.sessions.pty(session.id, { cols: 90, rows: 33 });
      let out = "";
      const reading = (async () => {
        for await (const chunk of pty) out += chunk.toString("utf8");
      })();
      const awaitOutput = async (want: string): Promise<void> => {
        for (const start = Date.now(); !out.includes(want); await sleep(20)) {
          assert.ok(Date.now() - start < 60_000, `the PTY printed no ${JSON.stringify(want)} within a minute; output: ${JSON.stringify(out)}`);
        }
      };
      pty.write("stty size\n");
      await awaitOutput("33 90");
      pty.resize(120, 40);
      pty.write("stty size\n");
      await awaitOutput("40 120");
      pty.write("exit 3\n");
      assert.equal(await pty.exit, 3);
      await reading;
    } finally {
      await wb.sessions.delete(session.id);
    }
  });
});
