// Package policies holds the platform's Rego (admission, runtime, spend) and the OPA engine
// that evaluates it at each decision point, with versioned uploads and modes
// enforce | warn | dryrun.
//
// # Rego contracts
//
// Every policy is one Rego v1 module whose package names its decision point. The shipped
// modules (admission.rego, runtime.rego, spend.rego, with their *_test.rego; run them with
// `opa test policies/`) always run; a project's policies run beside them.
//
//	package wb.admission
//	  input:  {"request": CreateRequest, "project_id", "plan": {"concurrency", "rate_per_sec"},
//	           "active_sessions"}
//	  deny     set of messages: any enforced message denies the create
//	  warn     set of messages
//	  defaults object: a JSON merge patch (RFC 7386) on the request, limited to tier,
//	           resources, idle_timeout_s, max_lifetime_s and metadata (no wb.* key): a value
//	           sets a field (over the caller's), an object merges key by key, null removes
//	           the field, the caller's value included ({"metadata": {"secret": null}}). Of
//	           two policies setting one field, the earlier wins (the platform's, then the
//	           project's by name); the plugins' patches apply after (plugins/ABI.md)
//
//	package wb.runtime
//	  input:  one guest event plus "session": {"id", "tier", "end_user_id", …}
//	          {"type": "exec"|"process_start", "argv": [...]}  (a PTY's command is an exec
//	           with "pty": true and argv ["/bin/sh", "-c", command], or ["/bin/sh"])
//	          {"type": "egress", "host", "port"}
//	          {"type": "resource_sample", "cpu_ms", "memory_bytes"}
//	  kill         object rule → message, or a set of rule names: kills the session
//	  allow_egress boolean, default false
//
//	package wb.spend
//	  input:  {"project_spend_micro_usd", "end_user_spend_micro_usd", "end_user_id", "plan",
//	           "caps": {"monthly_spend_cap_micro_usd", "end_user_monthly_spend_cap_micro_usd"}}
//	  stop_sessions  "project" | "end_user" (undefined: nothing to stop)
//	  deny_admission boolean
//	  warn           set of messages
//
// The engine asks a policy only for the rules above that its point reads; other rules are
// helpers, evaluated only as those need them.
//
// A policy may declare masked := ["request.metadata.secret", …]: dotted paths into its input
// ("*" matches any key or element) whose values the decision log writes as "***".
//
// # Modes
//
// enforce: denials deny, kills kill, stops stop. warn: they become warnings; grants
// (defaults, allow_egress) still apply. dryrun: nothing applies; the decision log records
// what would have happened ("would deny").
//
// # What a policy may do
//
// A project's Rego runs inside the control plane, so it is bounded (bounded.go):
//
//   - No network, no host, no randomness: http.send, net.lookup_ip_addr,
//     providers.aws.sign_req, opa.runtime, trace, json.match_schema and json.verify_schema
//     (they load $ref schemas from files and URLs), rand.intn and uuid.rfc4122 (a decision
//     must follow from its input) are not available, nor are the builtins whose work inside
//     one call has no useful bound: strings.render_template, graph.reachable_paths,
//     regex.globs_match, rego.parse_module. A policy that calls one does not compile.
//     time.now_ns stays (time-of-day rules), and so do io.jwt.* with keys given inline.
//   - Time: a project's policies get Options.EvalTimeout (250 ms) per decision. A builtin
//     call does not look at that deadline, so the builtins whose work inside one call grows
//     faster than their operands are bounded in work before they run: regular expressions
//     (patterns of at most 16 KiB and 65,536 instructions; instructions times the text their
//     searches read, counted as they run, or for the all-match ones with assertions times the
//     whole text, and again unless counting their matches first finds few, times the groups
//     for those answering them: regexwork.go, regexmatch.go, regexall.go;
//     regex.is_valid's pattern at most 16 KiB; the Unicode classes of either counted from
//     the pattern's text before parsing, and so are the ranges (?i) folds), keys and certificates (the squares of their
//     base64 runs: keywork.go), graphql validation (a 2 KiB query), object.subset (its
//     operands' elements, long strings weighing more, multiplied), the time and semver
//     builtins (texts of at most 1 KiB, time zone names 256 bytes), units.parse and units.parse_bytes (exponents of at most 1000),
//     net.cidr_contains_matches (32,768 pairs, and the probes of OPA's set for its answer),
//     net.cidr_merge (16,384 CIDRs: cidrwork.go); glob.match runs on Go's regexp, in linear time (globmatch.go), its
//     glob bounded like a pattern.
//   - Memory: the builtins that make strings or collections (sprintf, concat, replace,
//     numbers.range, split, regex.*, json/yaml (un)marshal, array.concat, union, …) run as
//     bounded versions that estimate what a call will make before making it and charge it to
//     the evaluation's budget, Options.EvalMemory (32 MiB); sprintf widths are at most 1000.
//     Numbers have at most 1000 digits. Going over fails the evaluation.
//   - Values: no value an evaluation makes (a comprehension's, a rule's or function's, an
//     array, object or set written with variables, a builtin's answer, a whole partial rule)
//     may be bigger than 4 MiB written out (or EvalMemory if smaller), each element counting
//     64 bytes, a collection counting what it holds in full however often it repeats it (a
//     value that shares its parts is as big, for comparison and conversion, as written out).
//     The elements a comprehension or a written collection makes are charged to EvalMemory.
//   - Size at upload: a value written out of rules that name rules (OPA's type checker walks
//     it expanded) may have at most 100,000 terms.
//   - Concurrency: at most Options.MaxProjectEvals decisions of one project evaluate its
//     policies at once; others wait within their deadline.
//
// testdata/hostile holds policies that try each of these; the tests and the conformance
// suite run them.
//
// # Tests of a project's policies
//
// RunTests (`wb policies test FILE.rego FILE_test.rego`) runs a policy's test_ rules as
// `opa test` does, with these capabilities, bounded builtins and budgets (each test its own),
// so a test that passes there passes on the platform. A test cannot mock a bounded builtin
// with `with` (they are renamed to their bounded versions after that check).
//
// # Failures
//
// The platform's rules run first and on their own; their kills and denials always apply. A
// project policy that cannot answer (it fails, runs out of time or memory, or its pinned
// version cannot be loaded) fails closed in enforce mode: at admission it denies, at runtime
// the event is refused (RuntimeDecision.Deny: no exec, no egress) while a kill by the
// platform's rules stands; in warn mode the failure is a warning. At spend, a failing project
// policy is a warning and stops nothing; the platform's cap still does (package decide, which
// composes these decisions with the project's plugins, states each point's failure mode).
//
// # Storage and evaluation
//
// Versions are immutable, numbered 1, 2, 3… per (project, name) and kept in Redis under the
// project's hash tag (store/keys.go lays the keys out): wb:{P}:pol:latest (name → latest N), wb:{P}:pol:v:NAME (N → source and
// metadata). A project has at most 64 names, and each keeps its newest 20 versions and any a
// live session pinned (Options.MaxPolicies, MaxVersions; Put deletes older ones), or that an
// admission named (Pin) within Options.PinWindow, before its session's pin is written
// (wb:{P}:pol:named). Delete removes every version of a name unless one is so kept; the name
// put again numbers on from its last version (wb:{P}:pol:retired, which keeps 256 names, past
// them the highest last version of the others, which every new name then numbers on from), so
// an id never names two sources. Each revision is compiled and prepared once and cached by (project, id).
// Admission and spend use each policy's latest version: a decision takes one immutable
// snapshot of the project's set, so a concurrent upload never mixes revisions inside a
// decision. Runtime uses the version the session pinned (pol_NAME@N) for its whole life.
//
// Every decision goes to a bounded asynchronous log: slog and the stream wb:{P}:decisions
// (MAXLEN ~ 10000). An entry keeps at most 8 KiB of the decision's result: past that, the
// messages that fit, "truncated": true and the count of each list. A full buffer drops entries and counts them
// (wb_policy_decision_log_dropped_total).
package policies
