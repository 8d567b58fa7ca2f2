package benchtable

// Ref names one metric of one benchmark: the Go package ("wb/store"), the benchmark's name
// without "Benchmark" and without its -GOMAXPROCS suffix ("Dial/bare"), and the unit as the
// benchmark reports it ("p50-µs"), except where benchfmt tidies it: ns/op is sec/op, and
// X-MB is X-B (in bytes).
type Ref struct {
	Pkg   string
	Bench string
	Unit  string
}

// A Pair declares that a figure is read against a baseline. In Figure, Bench may be a
// path.Match pattern ("RunsPython/*": every deployment). In Baseline, an empty Pkg means the
// figure's package, and an empty Bench the figure's own benchmark (the same result line).
// The two units are the same, both times (sec/op, …-ns, …-µs, …-ms: compared in seconds), or
// both rates (…/s).
type Pair struct {
	Figure   Ref
	Baseline Ref
	Why      string
}

// Pairs is the declaration: every figure that has a baseline, and which. A fresh slice each
// call, so no caller can change another's.
func Pairs() []Pair {
	const (
		store    = "wb/store"
		plugins  = "wb/plugins"
		netguard = "wb/internal/netguard"
		gateway  = "wb/gateway"
		policies = "wb/policies"
		quota    = "wb/quota"
		placer   = "wb/placer"
		oci      = "wb/hypervisor/oci"
		conf     = "wb/conformance"
		desktop  = "wb/desktop"
		chapi    = "wb/hypervisor/cloudhv/chapi"
		cloudhv  = "wb/hypervisor/cloudhv"
	)
	redisSet := Ref{store, "RedisBenchmarkSet", ""}
	with := func(r Ref, unit string) Ref { r.Unit = unit; return r }
	ps := []Pair{
		// store: a state change's Lua script against redis-benchmark's SET, 16 clients each.
		{Ref{store, "Create", "p50-µs"}, with(redisSet, "p50-µs"), "a create's script beside a bare SET"},
		{Ref{store, "Create", "p99-µs"}, with(redisSet, "p99-µs"), "a create's script beside a bare SET"},
		{Ref{store, "Create", "ops/s"}, with(redisSet, "requests/s"), "a create's script beside a bare SET"},
		{Ref{store, "Transition", "p50-µs"}, with(redisSet, "p50-µs"), "a transition's script beside a bare SET"},
		{Ref{store, "Transition", "p99-µs"}, with(redisSet, "p99-µs"), "a transition's script beside a bare SET"},
		{Ref{store, "Transition", "ops/s"}, with(redisSet, "requests/s"), "a transition's script beside a bare SET"},
		{Ref{store, "ChangePublish", "sec/op"}, Ref{gateway, "RedisPing", "p50-µs"}, "PUBLISH and two BLPOPs beside one PING"},

		// placer: one placement (a create's path) beside one PING on the same client.
		{Ref{placer, "PlaceOne", "p50-µs"}, Ref{"", "", "ping-p50-µs"}, "one placement beside one PING"},
		{Ref{placer, "PlaceOne", "p99-µs"}, Ref{"", "", "ping-p99-µs"}, "one placement beside one PING"},

		// plugins: the SDK and the example beside a hand-written module; the cache beside none.
		{Ref{plugins, "Decide/rawgo", "p50_µs"}, Ref{"", "Decide/raw", "p50_µs"}, "the Go runtime's entry and exit"},
		{Ref{plugins, "Decide/rawgo", "p99_µs"}, Ref{"", "Decide/raw", "p99_µs"}, "the Go runtime's entry and exit"},
		{Ref{plugins, "Decide/noop", "p50_µs"}, Ref{"", "Decide/raw", "p50_µs"}, "the SDK's decoding and encoding"},
		{Ref{plugins, "Decide/noop", "p99_µs"}, Ref{"", "Decide/raw", "p99_µs"}, "the SDK's decoding and encoding"},
		{Ref{plugins, "Decide/allowlist", "p50_µs"}, Ref{"", "Decide/raw", "p50_µs"}, "the example plugin"},
		{Ref{plugins, "Decide/allowlist", "p99_µs"}, Ref{"", "Decide/raw", "p99_µs"}, "the example plugin"},
		{Ref{plugins, "Compile/cached", "sec/op"}, Ref{"", "Compile/cold", "sec/op"}, "what the compilation cache saves"},

		// netguard: a guarded dial beside a bare net.Dialer of the same listener.
		{Ref{netguard, "Dial/guarded", "sec/op"}, Ref{"", "Dial/bare", "sec/op"}, "parse and check"},

		// gateway: a create beside a PING at the same parallelism; ext_authz beside a bare GET
		// and a no-op gRPC call at the same concurrency.
		// Saturated by wrk (a C client, as redis-benchmark is): the ratio of creates/s
		// to SET/s, 16 connections each, the SETs on the gateway's Redis before and after each
		// of three create runs, the medians of each (the benchmark's ratio-median is the median
		// of each run's ratio to the SETs around it).
		{Ref{gateway, "CreateSaturated", "creates/s"}, Ref{"", "", "redis-sets/s"}, "wrk's creates beside redis-benchmark's SETs, 16 clients each"},
		{Ref{gateway, "CreateSaturated", "p50-µs"}, Ref{"", "", "redis-set-p50-µs"}, "wrk's creates beside redis-benchmark's SETs, 16 clients each"},
		{Ref{gateway, "CreateSaturated", "p99-µs"}, Ref{"", "", "redis-set-p99-µs"}, "wrk's creates beside redis-benchmark's SETs, 16 clients each"},
		{Ref{gateway, "CreateSaturated", "creates-64conns/s"}, Ref{"", "", "redis-sets/s"}, "wrk's creates from 64 connections beside redis-benchmark's SETs from 16 clients"},
		// And beside the floor of any API on the same stack: wrk's POSTs to a net/http handler
		// that does one go-redis SET and answers a create's bytes.
		{Ref{gateway, "CreateSaturated", "creates/s"}, Ref{"", "", "floor-requests/s"}, "wrk's creates beside wrk's POSTs to net/http and one SET"},
		{Ref{gateway, "CreateSaturated", "p50-µs"}, Ref{"", "", "floor-p50-µs"}, "wrk's creates beside wrk's POSTs to net/http and one SET"},
		{Ref{gateway, "CreateSaturated", "p99-µs"}, Ref{"", "", "floor-p99-µs"}, "wrk's creates beside wrk's POSTs to net/http and one SET"},
		// What each costs the machine, which its load disturbs less than a rate: Redis's CPU
		// per create beside per SET (the admission script's share), and the gateway's beside
		// the floor's per request (the handler's own share).
		{Ref{gateway, "CreateSaturated", "redis-cpu-per-create-µs"}, Ref{"", "", "redis-cpu-per-set-µs"}, "Redis's CPU for one create beside one SET"},
		{Ref{gateway, "CreateSaturated", "gateway-cpu-per-create-µs"}, Ref{"", "", "floor-cpu-per-request-µs"}, "the gateway's CPU for one create beside the floor's for one POST and SET"},
		{Ref{gateway, "CreateSession", "sec/op"}, Ref{"", "RedisPing", "sec/op"}, "8 clients each"},
		{Ref{gateway, "CreateSession", "p50-µs"}, Ref{"", "RedisPing", "p50-µs"}, "8 clients each"},
		{Ref{gateway, "CreateSession", "p99-µs"}, Ref{"", "RedisPing", "p99-µs"}, "8 clients each"},
		{Ref{gateway, "CreateSession", "creates/s"}, Ref{"", "RedisPing", "pings/s"}, "8 clients each"},
		// Open loop at half of wrk's saturated rate: the p99 ≤ 3 ms and ≤ 4 × p50.
		{Ref{gateway, "CreateHalfSaturated", "p50-µs"}, Ref{"", "RedisPing", "p50-µs"}, "a create at half of saturation beside a PING"},
		{Ref{gateway, "CreateHalfSaturated", "p99-µs"}, Ref{"", "CreateHalfSaturated", "p50-µs"}, "at half of saturation, the tail beside the median"},
		{Ref{gateway, "CreateHalfSaturated", "late-p99-µs"}, Ref{"", "CreateHalfSaturated", "p99-µs"}, "how late the open-loop client sent, beside the tail"},
		// And beside the stack's floor (net/http and one SET), open loop at half of its own
		// saturation, and at the creates' rate.
		{Ref{gateway, "CreateHalfSaturated", "p50-µs"}, Ref{"", "", "floor-half-p50-µs"}, "each at half of its saturation: a create beside net/http and one SET"},
		{Ref{gateway, "CreateHalfSaturated", "p99-µs"}, Ref{"", "", "floor-half-p99-µs"}, "each at half of its saturation: a create beside net/http and one SET"},
		{Ref{gateway, "CreateHalfSaturated", "p50-µs"}, Ref{"", "", "floor-same-p50-µs"}, "at the same rate: a create beside net/http and one SET"},
		{Ref{gateway, "CreateHalfSaturated", "p99-µs"}, Ref{"", "", "floor-same-p99-µs"}, "at the same rate: a create beside net/http and one SET"},
		{Ref{gateway, "CreateAt2000PerSec", "p50-µs"}, Ref{"", "RedisPing", "p50-µs"}, "a create at 2,000/s beside a PING"},
		{Ref{gateway, "CreateAt2000PerSec", "p99-µs"}, Ref{"", "RedisPing", "p99-µs"}, "a create at 2,000/s beside a PING"},
		{Ref{gateway, "CreateWithPlugin", "p50-µs"}, Ref{"", "CreateAt2000PerSec", "p50-µs"}, "one plugin in the chain"},
		{Ref{gateway, "CreateWithPlugin", "p99-µs"}, Ref{"", "CreateAt2000PerSec", "p99-µs"}, "one plugin in the chain"},
		{Ref{gateway, "AuthzCheck", "p50-µs"}, Ref{"", "", "grpc-noop-p50-µs"}, "Check beside gRPC alone"},
		{Ref{gateway, "AuthzCheck", "p99-µs"}, Ref{"", "", "grpc-noop-p99-µs"}, "Check beside gRPC alone"},
		{Ref{gateway, "AuthzCheck", "p50-µs"}, Ref{"", "", "redis-get-p50-µs"}, "Check beside one uncached lookup"},
		{Ref{gateway, "AuthzCheck", "p99-µs"}, Ref{"", "", "redis-get-p99-µs"}, "Check beside one uncached lookup"},
		{Ref{gateway, "AuthzCheck", "checks/s"}, Ref{"", "", "redis-gets/s"}, "Check beside one uncached lookup"},
		// From h2load, a C client, as Envoy would send them (4 connections of 16 streams).
		{Ref{gateway, "AuthzCheckH2load", "p50-µs"}, Ref{"", "", "grpc-noop-p50-µs"}, "Check beside gRPC alone, 64 in flight from h2load"},
		{Ref{gateway, "AuthzCheckH2load", "p99-µs"}, Ref{"", "", "grpc-noop-p99-µs"}, "Check beside gRPC alone, 64 in flight from h2load"},
		{Ref{gateway, "AuthzCheckH2load", "checks/s"}, Ref{"", "", "grpc-noops/s"}, "Check beside gRPC alone, 64 in flight from h2load"},

		// policies: the engine beside the bare prepared query; a tenant policy beside none.
		{Ref{policies, "AdmitShipped", "p50-µs"}, Ref{"", "ShippedAdmissionEval", "p50-µs"}, "the engine around the query"},
		{Ref{policies, "AdmitShipped", "p99-µs"}, Ref{"", "ShippedAdmissionEval", "p99-µs"}, "the engine around the query"},
		{Ref{policies, "AdmitShippedAndTenant", "p50-µs"}, Ref{"", "AdmitShipped", "p50-µs"}, "one tenant policy more"},
		{Ref{policies, "AdmitShippedAndTenant", "p99-µs"}, Ref{"", "AdmitShipped", "p99-µs"}, "one tenant policy more"},

		// quota: records settled beside bare SETs.
		{Ref{quota, "Settler", "records/s"}, with(redisSet, "requests/s"), "a record's settlement beside a bare SET"},

		// desktop: sleep and wake beside the sessions API's memory snapshot and restore.
		{Ref{desktop, "DesktopSleepWake", "sleep-p50-ms"}, Ref{"", "", "baseline-snapshot-mem-p50-ms"}, "sleep beside a memory snapshot"},
		{Ref{desktop, "DesktopSleepWake", "sleep-p99-ms"}, Ref{"", "", "baseline-snapshot-mem-p99-ms"}, "sleep beside a memory snapshot"},
		{Ref{desktop, "DesktopSleepWake", "wake-to-mcp-answer-p50-ms"}, Ref{"", "", "baseline-restore-to-exec-p50-ms"}, "wake beside a restore"},
		{Ref{desktop, "DesktopSleepWake", "wake-to-mcp-answer-p99-ms"}, Ref{"", "", "baseline-restore-to-exec-p99-ms"}, "wake beside a restore"},

		// Cloud Hypervisor: the client beside a hand-written exchange; the driver beside chapi.
		{Ref{chapi, "ClientPause", "sec/op"}, Ref{"", "BaselineRawPut", "sec/op"}, "the same PUT by hand"},
		{Ref{chapi, "ClientResize", "sec/op"}, Ref{"", "BaselineRawPut", "sec/op"}, "a PUT by hand"},
		{Ref{chapi, "ClientCreate", "sec/op"}, Ref{"", "BaselineRawPut", "sec/op"}, "a PUT by hand"},
		{Ref{chapi, "ClientPing", "sec/op"}, Ref{"", "BaselineRawPut", "sec/op"}, "a request by hand"},
		{Ref{chapi, "ClientInfo", "sec/op"}, Ref{"", "BaselineRawPut", "sec/op"}, "a request by hand"},
		{Ref{cloudhv, "Calls/driver/Info", "sec/op"}, Ref{"", "Calls/bare/vm.info", "sec/op"}, "the driver's own cost"},
		{Ref{cloudhv, "Calls/driver/PauseResume", "sec/op"}, Ref{"", "Calls/bare/vm.pause+vm.resume", "sec/op"}, "the driver's own cost"},
		{Ref{cloudhv, "Calls/driver/Stats", "sec/op"}, Ref{"", "Calls/bare/vm.info", "sec/op"}, "beside one API call"},
		{Ref{cloudhv, "Calls/driver/DialAgent", "sec/op"}, Ref{"", "Calls/bare/vmm.ping", "sec/op"}, "beside one API call"},

		// conformance: a run beside a bare python3 on the host; an idle fleet beside one project.
		{Ref{conf, "RunsPython/*", "p50-ms"}, Ref{"", "", "bare-p50-ms"}, "a run beside a bare python3"},
		{Ref{conf, "RunsPython/*", "p99-ms"}, Ref{"", "", "bare-p99-ms"}, "a run beside a bare python3"},
		{Ref{conf, "RunsPython1/*", "p50-ms"}, Ref{"", "", "bare-p50-ms"}, "a run beside a bare python3"},
		{Ref{conf, "RunsPython1/*", "p99-ms"}, Ref{"", "", "bare-p99-ms"}, "a run beside a bare python3"},
		{Ref{conf, "RunsPythonPaced/*", "p50-ms"}, Ref{"", "", "bare-p50-ms"}, "a run beside a bare python3"},
		{Ref{conf, "RunsPythonPaced/*", "p99-ms"}, Ref{"", "", "bare-p99-ms"}, "a run beside a bare python3"},
	}
	// The OCI driver and the platform's cold start beside a bare `runc run`/`runsc run` of the
	// same root file system (hypervisor/oci BenchmarkCreateBoot/bare-…).
	for _, rt := range []string{"runc", "runsc"} {
		bare := Ref{oci, "CreateBoot/bare-" + rt, "sec/op"}
		ps = append(ps,
			Pair{Ref{oci, "CreateBoot/" + rt, "sec/op"}, bare, "the driver's create and boot"},
			Pair{Ref{conf, "CreateCold/" + rt, "p50-ms"}, bare, "a cold session beside a bare run"},
			Pair{Ref{conf, "CreateCold/" + rt, "p99-ms"}, bare, "a cold session beside a bare run"},
			Pair{Ref{conf, "CreateWarm/" + rt, "p50-ms"}, bare, "a warm session beside a bare run"},
			Pair{Ref{conf, "CreateWarm/" + rt, "p99-ms"}, bare, "a warm session beside a bare run"},
			// Each run destroys its guest: bare runs of python on the same template, 4 clients
			// each, are the ceiling of the platform's.
			Pair{Ref{conf, "RunsPython/" + rt, "runs/s"}, Ref{oci, "RunsPython/bare-" + rt, "runs/s"}, "4 clients' runs beside 4 clients' bare runs of python"},
			Pair{Ref{conf, "RunsPython/" + rt, "sec/op"}, Ref{oci, "RunsPython/bare-" + rt, "sec/op"}, "4 clients' runs beside 4 clients' bare runs of python"},
			// What the platform adds to a run, in the CPU the host spends on it (where runs/s
			// is what the host's two cores can spend).
			Pair{Ref{conf, "RunsPython/" + rt, "host-cpu-ms"}, Ref{oci, "RunsPython/bare-" + rt, "host-cpu-ms"}, "a run's host CPU beside a bare run's, 4 clients each"},
		)
	}
	// An idle runsc guest running the agent, beside a bare sandbox running sleep: the CPU its
	// host pays for it while nothing happens (hypervisor/oci BenchmarkIdleGuest).
	ps = append(ps, Pair{Ref{oci, "IdleGuest/runsc", "cpu-%core"}, Ref{oci, "IdleGuest/bare-runsc", "cpu-%core"}, "an idle guest's CPU beside a bare sandbox's"})
	// Pause and resume, the driver's and the platform's, beside a bare `RUNTIME pause` +
	// `RUNTIME resume` of a bare container on the same root file system (hypervisor/oci
	// BenchmarkPauseResume/bare-…).
	for _, rt := range []string{"runc", "runsc"} {
		bare := Ref{oci, "PauseResume/bare-" + rt, "sec/op"}
		ps = append(ps, Pair{Ref{oci, "PauseResume/" + rt, "sec/op"}, bare, "the driver's pause and resume"})
		for _, u := range []string{"pause-p50-ms", "pause-p99-ms", "resume-p50-ms", "resume-p99-ms"} {
			ps = append(ps, Pair{Ref{oci, "PauseResume/" + rt, u}, with(bare, u), "the driver's, beside the bare runtime's"})
		}
		ps = append(ps, Pair{Ref{conf, "PauseResume/" + rt, "sec/op"}, bare, "the API's pause and resume"})
		for _, u := range []string{"pause-p50-ms", "resume-p50-ms"} {
			ps = append(ps, Pair{Ref{conf, "PauseResume/" + rt, u}, with(bare, u), "the API's, beside the bare runtime's"})
		}
	}
	// runsc's snapshot with memory, delete and restore, the driver's and the platform's, beside
	// a bare `runsc checkpoint`, `runsc delete` and `runsc restore` of a bare container on the
	// same root file system (hypervisor/oci BenchmarkCheckpointRestore/bare-runsc).
	bareCkpt := Ref{oci, "CheckpointRestore/bare-runsc", "sec/op"}
	ps = append(ps,
		Pair{Ref{oci, "CheckpointRestore/runsc", "sec/op"}, bareCkpt, "snapshot, delete, restore beside the bare runsc's"},
		// image-B: benchfmt's tidy unit for the benchmarks' image-MB.
		Pair{Ref{oci, "CheckpointRestore/runsc", "image-B"}, with(bareCkpt, "image-B"), "the memory image beside the bare runsc's"},
	)
	for _, p := range []string{"p50", "p99"} {
		ckpt, restore := with(bareCkpt, "checkpoint-"+p+"-ms"), with(bareCkpt, "restore-"+p+"-ms")
		both := with(bareCkpt, "checkpoint-and-restore-"+p+"-ms")
		ps = append(ps,
			Pair{Ref{oci, "CheckpointRestore/runsc", "snapshot-" + p + "-ms"}, ckpt, "the driver's memory snapshot beside a bare checkpoint"},
			Pair{Ref{oci, "CheckpointRestore/runsc", "delete-" + p + "-ms"}, with(bareCkpt, "delete-"+p+"-ms"), "the driver's delete beside a bare one"},
			Pair{Ref{oci, "CheckpointRestore/runsc", "restore-" + p + "-ms"}, restore, "the driver's restore beside a bare one"},
			// A session's memory snapshot checkpoints the guest, answers, and restores it under
			// a new id (node takeSnapshot), the old one deleted in the background; back is the
			// snapshot's start to the session's next exec answered.
			Pair{Ref{conf, "SnapshotRestore/runsc", "snapshot-" + p + "-ms"}, ckpt, "the API's memory snapshot beside a bare checkpoint"},
			Pair{Ref{conf, "SnapshotRestore/runsc", "back-" + p + "-ms"}, both, "a memory snapshot until its session's next exec beside a bare checkpoint and restore"},
			Pair{Ref{conf, "SnapshotRestore/runsc", "restore-" + p + "-ms"}, restore, "a restore to running beside a bare one"},
			// runc keeps no memory: its snapshot pauses, writes the layer and resumes, and its
			// restore boots afresh.
			Pair{Ref{conf, "SnapshotRestore/runc", "snapshot-" + p + "-ms"}, Ref{oci, "PauseResume/bare-runc", "sec/op"}, "a disk snapshot beside a bare pause and resume"},
			Pair{Ref{conf, "SnapshotRestore/runc", "back-" + p + "-ms"}, Ref{oci, "PauseResume/bare-runc", "sec/op"}, "a disk snapshot until its session's next exec beside a bare pause and resume"},
			Pair{Ref{conf, "SnapshotRestore/runc", "restore-" + p + "-ms"}, Ref{oci, "CreateBoot/bare-runc", "sec/op"}, "a disk restore (a boot) beside a bare run"},
		)
	}
	for _, who := range []string{"wb", "redis"} {
		u := who + "-cpu-%core"
		ps = append(ps, Pair{Ref{conf, "IdleCPU/projects=10000", u}, Ref{"", "IdleCPU/projects=1", u}, "10,000 idle projects beside one"})
	}
	return ps
}
