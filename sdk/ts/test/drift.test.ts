// src/openapi.ts is what openapi-typescript makes of gateway/openapi.json (npm run generate).
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { test } from "node:test";

test("src/openapi.ts matches gateway/openapi.json (else: npm run generate, and commit it)", () => {
  const root = fileURLToPath(new URL("../..", import.meta.url));
  // The generate script's own flags, with --check: exits 1 when the file would change.
  const r = spawnSync("npm", ["run", "--silent", "generate", "--", "--check"], { cwd: root, encoding: "utf8" });
  assert.equal(
    r.status,
    0,
    `src/openapi.ts is stale against gateway/openapi.json: run \`npm run generate\` in sdk/ts and commit src/openapi.ts\n${r.stdout}${r.stderr}`,
  );
});
