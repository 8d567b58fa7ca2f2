#!/usr/bin/env bash
# make test, after make deps: every test, with -race, as fast as two cores allow.
#
#  1. The builds the tests share, side by side: the static wb that the tests run as a server
#     (bin/wb-test, WB_TEST_BIN) and the agent its guests run (bin/wb-agent); and the
#     race-built fake Cloud Hypervisor (bin/fakech) then the waiting packages' test binaries.
#     The two share no compiled package, and each build ends in a link that keeps one core.
#  2. Two lanes at once. go test's -p bounds builds and test binaries together, two on two
#     cores, and the packages that mostly wait (on Chromium in gVisor guests, on a fleet's
#     timers: WAITING) held both places for minutes of a cold run while the compiler waited
#     (desktop and desktop/guest side by side for 236 s). So they run one at a time in a lane
#     of their own, after the TypeScript SDK's tests, while go test builds and runs the rest
#     two at a time: a CPU-bound timing test has at most one other package beside it and one
#     that waits.
#  3. The attacks (fork bombs, floods, starved guests), after both lanes and one package at a
#     time, so that no timing test (idle deadlines, pause, checkpoint) runs beside them.
#
# PKGS (default ./...) limits the Go packages, as go test's arguments would.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
PKGS=${PKGS:-./...}
WAITING=(wb/conformance/chaos wb/desktop wb/desktop/guest)
ATTACKS='^(TestAdversarial|TestExhaustion)$'
export WB_TEST_BIN=$PWD/bin/wb-test WB_TEST_AGENT_BIN=$PWD/bin/wb-agent WB_TEST_FAKECH=$PWD/bin/fakech

mapfile -t all < <("$GO" list $PKGS) || exit 1
[ ${#all[@]} -gt 0 ] || exit 1
# The slowest of the rest in a cold run, slowest first: go test starts packages in the order
# it is given them, and node (222 s) and plugins (177 s), last in import-path order, were
# the last to finish.
SLOW=(wb/node wb/plugins wb/gateway wb/cmd/wb wb/conformance wb/conformance/suite
	wb/hypervisor/oci wb/hypervisor/cloudhv/chvtest wb/store wb/hypervisor/cloudhv)

member() { printf '%s\n' "${@:2}" | grep -qxF "$1"; }
waiting=() rest=()
for p in "${SLOW[@]}"; do
	if member "$p" "${all[@]}"; then rest+=("$p"); fi
done
for p in "${all[@]}"; do
	if member "$p" "${WAITING[@]}"; then
		waiting+=("$p")
	elif ! member "$p" "${SLOW[@]}"; then
		rest+=("$p")
	fi
done
bins=$(mktemp -d /tmp/wb-test-bins.XXXXXX)
logs=$(mktemp -d /tmp/wb-test-logs.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$bins" "$logs"' EXIT

# 1. -s -w: no symbol table or DWARF, as go test links its own binaries; it halved the link.
# -vet=off: make lint runs every analyzer.
(
	set -e
	CGO_ENABLED=0 "$GO" build -ldflags='-s -w' -o bin/wb-test ./cmd/wb
	CGO_ENABLED=0 "$GO" build -ldflags='-s -w' -o bin/wb-agent ./cmd/wb-agent
) &
static=$!
# The fake VMM runs on the host only: built as the tests are (-race), it shares their compiled
# packages, where a static build compiled its OpenAPI validator again (3 min cold).
"$GO" build -race -ldflags='-s -w' -o bin/fakech ./hypervisor/cloudhv/chvtest/fakech || exit 1
if [ ${#waiting[@]} -gt 0 ]; then
	"$GO" test -vet=off -race -c -ldflags='-s -w' -o "$bins/" "${waiting[@]}" || exit 1
fi
wait $static || exit 1

# step NAME DIR COMMAND... runs COMMAND in DIR and prints one line as go test does (and the
# whole output when it fails). Answers COMMAND's status.
step() {
	local name=$1 dir=$2 log start rc
	shift 2
	log="$logs/$(echo "$name" | tr '/ ' __).log"
	start=$(date +%s)
	(cd "$dir" && "$@") >"$log" 2>&1
	rc=$?
	if [ $rc -eq 0 ]; then
		printf 'ok  \t%s\t%ds\n' "$name" $(($(date +%s) - start))
	else
		cat "$log"
		printf 'FAIL\t%s\t%ds\n' "$name" $(($(date +%s) - start))
	fi
	return $rc
}

# waitingLane is lane one: the TypeScript SDK (its unit tests, its drift from the OpenAPI
# document, and seed 000's patterns against a wb serve of bin/wb-test with runc guests), then
# each waiting package's test binary in its directory, as go test runs it.
waitingLane() {
	local rc=0 p
	step "sdk/ts (npm test)" sdk/ts sh -c 'npm ci --no-audit --no-fund && npm test' || rc=1
	for p in "${waiting[@]}"; do
		step "$p" "$("$GO" list -f '{{.Dir}}' "$p")" "$bins/$(basename "$p").test" \
			-test.paniconexit0 -test.count=1 -test.timeout=20m -test.skip "$ATTACKS" || rc=1
	done
	return $rc
}

# 2.
rc=0
waitingLane &
lane=$!
if [ ${#rest[@]} -gt 0 ]; then
	"$GO" test -vet=off -race -count=1 -timeout 20m -skip "$ATTACKS" "${rest[@]}" || rc=1
fi
wait $lane || rc=1

# 3.
attack=()
for p in "${all[@]}"; do
	case $p in wb/node | wb/conformance) attack+=("$p") ;; esac
done
if [ ${#attack[@]} -gt 0 ]; then
	"$GO" test -vet=off -race -count=1 -timeout 20m -p 1 -run "$ATTACKS" "${attack[@]}" || rc=1
fi
exit $rc
