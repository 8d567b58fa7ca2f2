// Package decide owns the three decision points of ARCHITECTURE.md — admission, runtime and
// spend — and how, at each, the platform's Rego (package policies) and the project's Wasm
// plugins (package plugins) are composed into one answer. The gateway asks Admit, the nodes
// ask Runtime (through cmd/wb's adapter), quota's enforcer asks Spend. Inputs are Go types;
// the clock is injected (Decider.Now); every decider's warnings are kept and returned.
//
// At every point the platform's Rego runs first, then the project's plugins in their order
// (plugins/ABI.md). Every plugin sees the original input. A plugin that fails (trap, timeout,
// bad result) answers a deny naming it unless it was uploaded fail_open, which turns its
// failure into an allow with a warning; a project Rego policy that fails is handled by package
// policies (in enforce mode: a deny at admission, a refused event at runtime, a warning at
// spend).
//
// # Failure modes
//
// One rule holds at every point: a broken tenant decider never disables the platform's own
// rules. How each point fails:
//
//   - Admission fails closed. Any deny wins. When the platform's Rego cannot decide, or the
//     plugin host cannot run the project's plugins (Redis down), Admit answers an error and the
//     create is refused. A patch outside PatchableFields is a *PatchError (403 naming the
//     decider and the field). Patches compose in order (internal/mergepatch.Compose), nulls
//     kept, so a later decider's null removes the field from the request.
//   - Runtime fails closed. A kill by the platform's Rego always stands and ends the decision.
//     When the platform's Rego cannot decide, Runtime answers an error and the node refuses the
//     event. A project policy that cannot decide, or plugins that cannot run, refuse the event
//     (Verdict.Refuse: no exec, no egress) without stopping the session. A plugin's deny,
//     including a fail-closed plugin's failure, stops the session (policy_violation, the rule
//     names the plugin).
//   - Spend never fails open on the platform's cap. A hard cap crossed stops the sessions in
//     its scope and denies admissions there whatever the tenant's deciders do: Spend starts
//     from that floor, and a tenant decider can only widen it (stop more, stop earlier), never
//     lift it. When the Rego engine or the plugin host fails, Spend still answers the floor and
//     says what failed in Warnings; it has no error to answer.
package decide
