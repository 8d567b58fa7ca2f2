// Package plugins is the wazero host for tenants' WebAssembly decision plugins: the ABI
// (ABI.md), the compile cache, bounded instance pools, memory and time limits. plugins/sdk is
// for authors; plugins/examples has three real plugins.
//
// A Host keeps the project's plugins in Redis (every key under wb:{PROJECT}:plugin:…, laid out
// in store/keys.go):
//
//	wb:{P}:plugin:meta          hash NAME → Plugin JSON (config included)
//	wb:{P}:plugin:wasm:HEX      the module, by sha256 digest (shared by names with one digest)
//	wb:{P}:plugin:limits        hash pages, timeout_ms: the project's limits (SetLimits)
//	wb:{P}:plugin:ver           counter bumped by every change above
//
// Each replica caches a project's plugin set and checks the counter at most once per
// Options.RefreshInterval, so a change made through another replica is seen within that
// interval (one made through this Host is seen at once). Gateways do better: every change is
// announced on store.Changes, and Put, Delete and SetLimits return only once each gateway has
// dropped its copy (Forget), so the next decision on any gateway reads the new set. A module is compiled once per digest
// (wazero's compilation cache, one runtime per memory limit sharing it); each (project, digest)
// has a bounded pool of instances, created on demand and reused call after call. Every call runs
// under its own deadline with WithCloseOnContextDone; an instance that fails in any way is
// closed and replaced, never reused. A module is rewritten before it is compiled so that its
// call stack is bounded (MaxStackBytes, stack.go): wazero's own ceiling is 100 MiB a call.
//
// Hot swap: Put and Delete publish a new plugin set atomically. Calls already running finish on
// the instance they hold; the old version's pool is retired and closes each instance as it comes
// back, and its compiled module once the last one is gone.
//
// Failure policy: a plugin that fails (traps, times out, exceeds its memory, answers something
// that is not a result) fails closed: Decide answers a deny whose reason names the plugin and
// the cause, unless the plugin was uploaded fail-open, in which case it answers an allow with a
// warning naming the failure. After 3 failed starts in a row a plugin's instances are not
// restarted for a while (1 s, doubling up to 30 s; pool.go), its calls answering the last
// failure, so a plugin that cannot start does not pay a start (1 s allowed, not 20 ms) every
// call; a call that fails on its input only discards its instance, and the start that replaces
// it is paced by the plugin's own start time (its callers wait). Decide answers an error only
// for the host's own failures (Redis) or when the caller's context ends.
package plugins
