// camelCase options to the API's snake_case and back.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { camelCase, snakeCase, toCamel, toSnake, Wb, type Session } from "../src/index.js";
import { opaqueProperties } from "../src/case.js";

test("keys map both ways at any depth; values, arrays and caller-keyed maps stay", () => {
  const params = {
    tier: 2,
    idleTimeoutS: 120,
    restoreFrom: "snap_1",
    resources: { sizeClass: "m", memoryMib: 512 },
    env: { MY_VAR: "x", camelVar: "y" },
    metadata: { ticketId: "T-1", some_key: "v" },
    command: ["echo", "a_b"],
  };
  const wire = {
    tier: 2,
    idle_timeout_s: 120,
    restore_from: "snap_1",
    resources: { size_class: "m", memory_mib: 512 },
    env: { MY_VAR: "x", camelVar: "y" },
    metadata: { ticketId: "T-1", some_key: "v" },
    command: ["echo", "a_b"],
  };
  assert.deepEqual(toSnake(params), wire);
  assert.deepEqual(toCamel(wire), params);
  assert.deepEqual(toCamel({ data: [{ exit_code: 0, usage_to_date: { mem_gib_ms: 1 } }], next_cursor: null }), {
    data: [{ exitCode: 0, usageToDate: { memGibMs: 1 } }],
    nextCursor: null,
  });
  for (const k of ["idle_timeout_s", "max_lifetime_s", "exec_url", "mem_gib_ms", "cold_start", "session_id"]) {
    assert.equal(snakeCase(camelCase(k)), k);
  }
});

test("every map keyed by the caller in the OpenAPI document passes unchanged", () => {
  const doc = JSON.parse(readFileSync(new URL("../../../../gateway/openapi.json", import.meta.url), "utf8")) as unknown;
  const maps = new Set<string>();
  const walk = (n: unknown): void => {
    if (Array.isArray(n)) {
      n.forEach(walk);
    } else if (n && typeof n === "object") {
      const props = (n as { properties?: Record<string, unknown> }).properties;
      for (const [name, schema] of Object.entries(props ?? {})) {
        const s = schema as { additionalProperties?: unknown; $ref?: string };
        const target = s.$ref ? resolve(doc, s.$ref) : s;
        const ap = (target as { additionalProperties?: unknown }).additionalProperties;
        if (ap === true || (ap !== null && typeof ap === "object")) {
          maps.add(name);
        }
      }
      Object.values(n).forEach(walk);
    }
  };
  walk(doc);
  assert.ok(maps.size > 0, "found no map properties: has the document's shape changed?");
  for (const name of maps) {
    assert.ok(opaqueProperties.has(name), `property ${name} is a map keyed by the caller: add it to opaqueProperties in src/case.ts`);
  }
});

function resolve(doc: unknown, ref: string): unknown {
  return ref
    .replace(/^#\//, "")
    .split("/")
    .reduce<unknown>((n, k) => (n as Record<string, unknown>)[k], doc);
}

test("the generated types read in camelCase", () => {
  // Compile-time: these assignments fail tsc if Camelize loses a key.
  const s: Pick<Session, "idleTimeoutS" | "usageToDate" | "stateReason"> = {
    idleTimeoutS: 300,
    usageToDate: { sessionS: 1, cpuMs: 2, memGibMs: 3, egressBytes: 4 },
    stateReason: null,
  };
  assert.equal(s.usageToDate.memGibMs, 3);
});

test("options are camelCase only (a compile-time check)", () => {
  const wb = new Wb({ url: "http://127.0.0.1:1", apiKey: "k" });
  // Never called: tsc refuses the snake_case spelling, and the seed's lines compile.
  const typed = async (store: Map<string, string>): Promise<void> => {
    // @ts-expect-error idle_timeout_s is spelled idleTimeoutS
    await wb.sessions.create({ tier: 2, idle_timeout_s: 120 });
    await wb.sessions.create({ tier: 2, restoreFrom: store.get("conv") });
    const run = await wb.runs.create({ sessionId: "sess_1", command: "true" });
    const exitCode: number | null = run.exitCode;
    void exitCode;
  };
  assert.equal(typeof typed, "function");
});
