// `wb serve --runtime runc --pool 0` of the tests' own, as client/serve_test.go starts one.
import { execFileSync, spawn, spawnSync } from "node:child_process";
import { chmodSync, copyFileSync, mkdtempSync, openSync, readFileSync, rmSync, closeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

export interface Server {
  url: string;
  apiKey: string;
  /** The end of its log, for a failure's message. */
  log(): string;
  stop(): Promise<void>;
}

function onPath(cmd: string): boolean {
  return spawnSync("sh", ["-c", `command -v ${cmd}`]).status === 0;
}

/** Why these tests cannot run here, or undefined when they can. */
export function skipReason(): string | undefined {
  if (process.getuid?.() !== 0) {
    return "wb serve with runc guests needs root: run the tests as root";
  }
  if (!onPath("runc")) {
    return "runc is not installed (apt-get install runc, or make deps)";
  }
  if (!onPath("busybox")) {
    return "busybox-static is needed to assemble the templates (apt-get install busybox-static)";
  }
  return undefined;
}

const repoRoot = fileURLToPath(new URL("../../../../", import.meta.url));

/**
 * Puts name at dir/name: a copy of the binary envVar names (make test builds them once), or a
 * static build of pkg from this repository.
 */
function install(dir: string, name: string, envVar: string, pkg: string): string {
  const out = join(dir, name);
  const src = process.env[envVar];
  if (src) {
    copyFileSync(src, out);
  } else {
    // Static: guests run the agent, and wb may be their agent.
    execFileSync("go", ["build", "-o", out, pkg], { cwd: repoRoot, env: { ...process.env, CGO_ENABLED: "0" }, stdio: "inherit" });
  }
  chmodSync(out, 0o755);
  return out;
}

/** Starts wb serve with real runc guests; stop() ends it and removes its guests and mounts. */
export async function startServe(): Promise<Server> {
  // Short, not the test's name: the guests' Unix socket paths must stay short.
  const tmp = mkdtempSync(join(tmpdir(), "wbts"));
  chmodSync(tmp, 0o755); // the guest's user must reach the agent binary
  install(tmp, "wb-agent", "WB_TEST_AGENT_BIN", "./cmd/wb-agent"); // wb finds it beside itself
  const bin = install(tmp, "wb", "WB_TEST_BIN", "./cmd/wb");
  const dataDir = join(tmp, "d");
  const stderrPath = join(tmp, "stderr");
  const stderr = openSync(stderrPath, "w");
  // wb serve takes its keys from WB_* when set: the caller's must not leak into the test's server.
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("WB_")));
  // Every tier allowed 20 s cold starts (a 60 s provisioning deadline), as Go's servetest
  // (LoadedColdStarts) does: with the production 2 s, a loaded machine's tier-1 run failed its start.
  const coldStarts = [1, 2, 3, 4].flatMap((tier) => ["--cold-p95", `${tier}=20s`]);
  const args = ["serve", "--addr", "127.0.0.1:0", "--runtime", "runc", "--pool", "0", "--data-dir", dataDir, ...coldStarts];
  const child = spawn(bin, args, {
    env,
    stdio: ["ignore", "pipe", stderr],
  });
  closeSync(stderr);
  const killOnExit = (): void => {
    child.kill("SIGKILL");
  };
  process.on("exit", killOnExit); // no Pdeathsig in Node: at least a clean exit of the tests ends it
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const log = (): string => {
    const b = readFileSync(stderrPath, "utf8");
    return b.length > 8000 ? b.slice(-8000) : b;
  };
  const stop = async (): Promise<void> => {
    process.off("exit", killOnExit);
    child.kill("SIGTERM");
    const timer = setTimeout(() => child.kill("SIGKILL"), 60_000);
    await exited;
    clearTimeout(timer);
    // The runtime's state: on the data dir's run dir (a tmpfs), or on its disk (older nodes).
    for (const stateRoot of [join(dataDir, "run", "oci-state"), join(dataDir, "oci-state")]) {
      const ids = spawnSync("runc", ["--root", stateRoot, "list", "-q"], { encoding: "utf8" }).stdout ?? "";
      for (const id of ids.split(/\s+/).filter(Boolean)) {
        spawnSync("runc", ["--root", stateRoot, "delete", "--force", id]);
      }
    }
    // The guests' root file systems, deepest first.
    const points = readFileSync("/proc/self/mountinfo", "utf8")
      .split("\n")
      .map((l) => l.split(" ")[4] ?? "")
      .filter((p) => p.startsWith(tmp + "/"))
      .sort((a, b) => b.length - a.length);
    for (const p of points) {
      spawnSync("umount", ["--lazy", p]);
    }
    rmSync(tmp, { recursive: true, force: true });
  };

  const vals = new Map<string, string>();
  let out = "";
  const stdout = child.stdout!;
  stdout.setEncoding("utf8");
  const ready = new Promise<void>((resolve, reject) => {
    stdout.on("data", (chunk: string) => {
      out += chunk;
      for (const line of out.split("\n")) {
        const eq = line.indexOf("=");
        if (eq > 0) vals.set(line.slice(0, eq), line.slice(eq + 1));
      }
      if (vals.get("WB_URL") && vals.get("WB_API_KEY")) resolve();
    });
    void exited.then(() => reject(new Error(`wb serve exited before printing WB_URL and WB_API_KEY; log:\n${log()}`)));
  });
  ready.catch(() => {}); // once the deadline won, its later rejection is no one's
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    // A cold, loaded machine's first start does the most.
    timer = setTimeout(() => reject(new Error(`wb serve printed no WB_URL/WB_API_KEY within 3 minutes; log:\n${log()}`)), 180_000);
  });
  try {
    await Promise.race([ready, deadline]);
  } catch (e) {
    await stop();
    throw e;
  } finally {
    clearTimeout(timer);
  }
  return { url: vals.get("WB_URL")!, apiKey: vals.get("WB_API_KEY")!, log, stop };
}
