#!/usr/bin/env bash
# make test: every test, with -race.
#
#  0. The Debian packages the tests need (scripts/deps.sh), when some are missing: installed
#     in the background while step 1 builds the static binaries, which need none of them (the
#     race builds need cgo's C compiler, so they wait). On a fresh Debian 12, apt alone took
#     60 s, and beside a cold build of wb the two took 175 s, where one after the other took
#     196. Checked first, so that a user who cannot install them learns it at once.
#  1. The builds the tests share: the static wb that the tests run as a server (bin/wb-test,
#     WB_TEST_BIN) and the agent its guests run (bin/wb-agent), then the race-built fake Cloud
#     Hypervisor (bin/fakech). One after the other: built side by side (they share no compiled
#     package), one cold run's builds took 545 s, where the last session's took 460. Tried and
#     given up: wb-test built with -race, sharing the tests' compiled packages (the static
#     build is 131 s of a cold run's builds). The run took as long (857 s, not 819–870): every
#     test that starts wb ran slower (conformance 162 s, not 67–80; cmd/wb 117, not 61–69), and
#     the attack suite's memory bounds on wb serve failed (race detection multiplies memory).
#     It did find a race in wb node's shutdown (fixed in cde284d): to look for more, run
#     `go build -race -o bin/wb-test ./cmd/wb` and the packages that start wb by hand, with
#     WB_TEST_BIN and GORACE's log_path set as below.
#  2. The TypeScript SDK's tests beside go test on every package, three at a time. Two at a
#     time (go test's default on two cores) left a third of the CPU idle over the packages'
#     run (sampled every 10 s in one cold run: 34 % idle from the first test to the last),
#     since the longest packages mostly wait on guests and timers (the chaos suite and the
#     conformance suite beside each other: 88 % idle). Three at a time: 18 % idle, and that
#     phase took 662 s, not 794. Tried before and given up, when a cold run took 35 minutes:
#     the packages that mostly wait in a lane of their own beside go test's two (slower: that
#     lane's compile came first), and the longest packages first (node then ran beside
#     desktop while the rest compiled, and two of its timing tests failed).
#  3. The attacks (fork bombs, floods, starved guests: conformance's TestAdversarial), after
#     the rest, so that no timing test (idle deadlines, pause, checkpoint) runs beside them.
#     (node had its own exhaustion test, the same five attacks with finer checks: 106 s of a
#     warm run, alone. Its checks are conformance's now, through the API.)
#
# PKGS (default ./...) limits the Go packages, as go test's arguments would.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
PKGS=${PKGS:-./...}
ATTACKS='^TestAdversarial$'
export WB_TEST_BIN=$PWD/bin/wb-test WB_TEST_AGENT_BIN=$PWD/bin/wb-agent WB_TEST_FAKECH=$PWD/bin/fakech

# 0.
missing=$(./scripts/deps.sh --missing) || exit 1
deps=
if [ -n "$missing" ]; then
	echo "installing in the background while wb builds: $missing"
	deps_log=$(mktemp)
	# A session of its own: an interrupted run (Ctrl-C) leaves apt to finish, where a dpkg
	# killed halfway leaves a machine that needs dpkg --configure -a.
	setsid ./scripts/deps.sh >"$deps_log" 2>&1 &
	deps=$!
fi

mapfile -t all < <("$GO" list $PKGS) || exit 1
[ ${#all[@]} -gt 0 ] || exit 1

# 1. -s -w: no symbol table or DWARF, as go test links its own binaries; it halved the link.
CGO_ENABLED=0 "$GO" build -ldflags='-s -w' -o bin/wb-test ./cmd/wb || exit 1
CGO_ENABLED=0 "$GO" build -ldflags='-s -w' -o bin/wb-agent ./cmd/wb-agent || exit 1
# Everything from here on builds with -race, hence cgo and a C compiler, which step 0 may be
# installing: wait for it; a failed install ends the run, with apt's output.
if [ -n "$deps" ]; then
	deps_rc=0
	wait $deps || deps_rc=$?
	cat "$deps_log"
	rm -f "$deps_log"
	if ((deps_rc)); then
		echo "FAIL	scripts/deps.sh (installing $missing: exit $deps_rc)"
		exit 1
	fi
fi
# The fake VMM runs on the host only: built as the tests are (-race), it shares their compiled
# packages (its OpenAPI checker, kin-openapi, among them), where a static build compiled them
# again.
"$GO" build -race -ldflags='-s -w' -o bin/fakech ./hypervisor/cloudhv/chvtest/fakech || exit 1
# Every race-built process of the run (the test binaries, and the fake VMM they start, whose
# stderr no one reads) writes its race reports to race_dir/report.PID, which fail the run.
race_dir=$PWD/bin/race
rm -rf "$race_dir" && mkdir -p "$race_dir" || exit 1
export GORACE="log_path=$race_dir/report${GORACE:+ $GORACE}"

# 2. The SDK: its unit tests, its drift from the OpenAPI document, and seed 000's patterns
# against a wb serve of bin/wb-test with runc guests. It mostly waits (npm, node's timers, a
# guest), so it runs beside go test's first compiles, in a session of its own that an
# interrupted run stops; its output follows go test's. -vet=off: make lint runs every analyzer.
rc=0
sdk_log=$(mktemp)
setsid bash -c 'cd sdk/ts && npm ci --no-audit --no-fund && npm test' >"$sdk_log" 2>&1 &
sdk=$!
# go test's output is also kept, for step 5.
go_log=$(mktemp)
trap 'kill -- -$sdk 2>/dev/null; rm -f "$sdk_log" "$go_log"' EXIT
"$GO" test -vet=off -race -count=1 -timeout 20m -p 3 -skip "$ATTACKS" "${all[@]}" 2>&1 | tee -a "$go_log" || rc=1
sdk_rc=0
wait $sdk || sdk_rc=$?
cat "$sdk_log"
if ((sdk_rc)); then
	echo "FAIL	sdk/ts (npm ci && npm test: exit $sdk_rc)"
	rc=1
fi

# 3.
attack=()
for p in "${all[@]}"; do
	case $p in wb/conformance) attack+=("$p") ;; esac
done
if [ ${#attack[@]} -gt 0 ]; then
	"$GO" test -vet=off -race -count=1 -timeout 20m -p 1 -run "$ATTACKS" "${attack[@]}" 2>&1 | tee -a "$go_log" || rc=1
fi

# 4. The race reports.
for r in "$race_dir"/report.*; do
	[ -e "$r" ] || continue
	echo "race detected: $r"
	cat "$r"
	rc=1
done

# 5. What failed, last: CI shows a long output's head and tail only, and a failed test's
# messages may be in neither (a failed fleet's logs filled the head once). Each failed test,
# the first lines it logged (a test reports what failed first; not a server's log lines, which
# some tests pass on), each cut to 300 bytes; and
# the tests a timeout's panic names as running.
if ((rc)); then
	echo "--- failures (from the output above):"
	awk '/^[ \t]*--- FAIL/ { print; n = 8; next }
		/^(FAIL|panic:)/ { print; n = 0; next }
		/^running tests:/ { print; r = 10; next }
		r > 0 && /^\t/ { print; r--; next }
		n > 0 && /^[ \t]+[^ \t]+\.go:[0-9]+: / && !/ level=(DEBUG|INFO|WARN|ERROR) / { print substr($0, 1, 300); n-- }' "$go_log" | head -n 80
fi
exit $rc
