# wb — see README.md. Every target works on a fresh Debian machine as root.
GO        ?= go
PKGS      ?= ./...

.PHONY: run test bench lint deps build security conformance fleet bench-fleet bench-chaos

# Install what the platform needs from Debian's packages when it is missing.
deps:
	@./scripts/deps.sh

# bin/wb-agent is the static agent that guests run; wb finds it beside itself.
build:
	CGO_ENABLED=0 $(GO) build -o bin/wb ./cmd/wb
	CGO_ENABLED=0 $(GO) build -o bin/wb-agent ./cmd/wb-agent

# The whole platform on one machine: prints WB_URL, WB_API_KEY and WB_ADMIN_KEY.
run: deps build
	./bin/wb serve --addr 127.0.0.1:8080

# A fleet on this machine (internal/fleet): a Redis Cluster of 3 primaries and 3 replicas, 3 wb
# nodes (runc; RUNTIME=runsc for gVisor) and 2 gateways, on loopback. Prints WB_URL, WB_URLS,
# WB_API_KEY and WB_ADMIN_KEY; Ctrl-C stops it and removes every process, guest and file.
RUNTIME ?= runc
fleet: deps build
	./bin/wb fleet --runtime $(RUNTIME)

# The fleet under load: wb load --fleet starts a fleet as make fleet does (no warm pool: every
# guest left after a run is a leak) and searches for the highest rate it sustains with create
# p99 ≤ BENCH_P99, no failed flow and no leak: from BENCH_RATE flows/s, doubling (halving when
# that rate fails), then halving the gap, each step driving both gateways open-loop for 60 s
# (create → exec → delete, ephemeral runs, pause/resume) and deleting what it made (each
# step's table on stderr). It prints the steps, then the whole table of the best rate's run:
# p50/p99/max per operation, errors, achieved rate, a baseline measured in the same run (GET
# /healthz and a Redis PING at the same rate) and the leaks (sessions still active (API), the
# project's concurrency slots (Redis), every node's guests). Exits 3 on a leak. Then the chaos
# suite at real timings (make bench-chaos).
BENCH_RATE ?= 1
BENCH_P99 ?= 10ms
bench-fleet: deps build
	./bin/wb load --fleet --fleet-runtime $(RUNTIME) --rate $(BENCH_RATE) --duration 60s --search-p99 $(BENCH_P99)
	$(MAKE) --no-print-directory bench-chaos

# The chaos suite (conformance/chaos, as root) at real timings, WB_CHAOS_TIMINGS=real: the
# webhook receiver down for ten minutes under wb's default backoff (no --webhook-max-backoff),
# the Redis Cluster's default cluster-node-timeout of 15 s, the gateways' default --node-timeout;
# make test runs it with short ones. About 25 minutes. Prints each case's figure lines, its
# other log lines and errors, and PASS/FAIL; the whole log (with the fleet's logs of a failed
# case) stays in the file it names. Fails when the suite does.
bench-chaos: deps build
	@log=$$(mktemp /tmp/wb-chaos-real.XXXXXX); \
	WB_CHAOS_TIMINGS=real WB_TEST_BIN=$(CURDIR)/bin/wb WB_TEST_AGENT_BIN=$(CURDIR)/bin/wb-agent \
		$(GO) test -count=1 -v -timeout 60m -run . ./conformance/chaos/ >$$log 2>&1; rc=$$?; \
	grep -E '_test\.go:[0-9]+: |^ *--- |^(ok|FAIL|PASS|panic)' $$log; \
	echo "chaos suite at real timings: exit $$rc, full log in $$log"; exit $$rc

# Every test, with -race (scripts/test.sh says how: the builds the tests share, one after another,
# the Debian packages installed while wb builds, the SDK's tests, go test on every package
# three at a time, then the attacks alone).
# go vet is make lint's (CI runs both): its analysis of every package and every dependency
# (for facts) took about as long again as compiling them, minutes of a cold make test.
# bin/wb-test is the static wb that the tests run as a server, and bin/wb-agent beside it the
# agent its guests run, and bin/fakech the fake Cloud Hypervisor; each is built once (the two
# static ones share compiled packages), and shared through WB_TEST_BIN, WB_TEST_AGENT_BIN and
# WB_TEST_FAKECH (internal/wbbin); a package tested alone builds its own. (Three test binaries
# each building a cgo fakech at once cost a cold run about eight minutes.) (A race-built
# server would reuse the race build, but compiles tenants' Wasm several times slower.)
test:
	GO="$(GO)" PKGS="$(PKGS)" ./scripts/test.sh

# The adversarial suite alone, with its table of attacks and results (make test runs it too).
security: deps
	$(GO) test -count=1 -v -timeout 20m -run 'TestAdversarial' ./conformance/

# The conformance suite (conformance/suite: every row of both seeds' tables, through the Go SDK)
# against a wb serve of bin/wb with runc guests, printing its table. Its Go test starts, stops
# and cleans up the server (internal/servetest), so CI and make test run the same thing.
conformance: export WB_TEST_BIN := $(CURDIR)/bin/wb
conformance: export WB_TEST_AGENT_BIN := $(CURDIR)/bin/wb-agent
conformance: deps build
	$(GO) test -count=1 -v -timeout 20m -run '^TestSuiteAgainstServe$$' ./conformance/suite/

# Every package's benchmarks (scripts/bench.sh says which, and how long each): their output in
# bin/bench.txt, then one table (internal/benchtable, also in bin/bench-table.txt) of each
# figure beside its baseline measured in the same run (redis-benchmark, a bare runc/runsc run
# of the same root file system, a bare python3, a PING, …) and their ratio. The benchmarks
# start their own redis-server on loopback. A failing package does not stop the others.
bench: deps
	GO="$(GO)" ./scripts/bench.sh

lint:
	@test -z "$$(gofmt -l .)" || { echo "gofmt would change:"; gofmt -l .; exit 1; }
	$(GO) vet $(PKGS)
