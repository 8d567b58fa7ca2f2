#!/usr/bin/env bash
# make test, after make deps: every test, with -race.
#
#  1. The builds the tests share: the static wb that the tests run as a server (bin/wb-test,
#     WB_TEST_BIN) and the agent its guests run (bin/wb-agent), then the race-built fake Cloud
#     Hypervisor (bin/fakech). One after the other: built side by side (they share no compiled
#     package), one cold run's builds took 545 s, where the last session's took 460.
#  2. The TypeScript SDK's tests, then go test on every package, two at a time (go test's
#     default on two cores). Tried and given up: the packages that mostly wait (desktops, the
#     chaos suite) in a lane of their own beside go test's two, compiled first. A cold run took
#     35.7 minutes, not 34.5: two cores are busy compiling or testing nearly all the time, the
#     first test started 200 s later (the compile go test had spread between tests came first),
#     the packages beside the lane slowed (cmd/wb 201 s, not 117), and plugins' call deadlines
#     failed with three packages running at once, as they had at -p 3. Also given up: the
#     longest packages first. node then ran beside desktop while the rest still compiled, and
#     two of its timing tests failed; in go list's order the two lanes already end together.
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

mapfile -t all < <("$GO" list $PKGS) || exit 1
[ ${#all[@]} -gt 0 ] || exit 1

# 1. -s -w: no symbol table or DWARF, as go test links its own binaries; it halved the link.
CGO_ENABLED=0 "$GO" build -ldflags='-s -w' -o bin/wb-test ./cmd/wb || exit 1
CGO_ENABLED=0 "$GO" build -ldflags='-s -w' -o bin/wb-agent ./cmd/wb-agent || exit 1
# The fake VMM runs on the host only: built as the tests are (-race), it shares their compiled
# packages (its OpenAPI checker, kin-openapi, among them), where a static build compiled them
# again. (With libopenapi-validator this build took 5.5 minutes cold: 470 CPU-seconds to
# compile that validator under -race, where kin-openapi takes about 40.)
"$GO" build -race -ldflags='-s -w' -o bin/fakech ./hypervisor/cloudhv/chvtest/fakech || exit 1

# 2. The SDK: its unit tests, its drift from the OpenAPI document, and seed 000's patterns
# against a wb serve of bin/wb-test with runc guests. -vet=off: make lint runs every analyzer.
rc=0
(cd sdk/ts && npm ci --no-audit --no-fund && npm test) || rc=1
"$GO" test -vet=off -race -count=1 -timeout 20m -skip "$ATTACKS" "${all[@]}" || rc=1

# 3.
attack=()
for p in "${all[@]}"; do
	case $p in wb/conformance) attack+=("$p") ;; esac
done
if [ ${#attack[@]} -gt 0 ]; then
	"$GO" test -vet=off -race -count=1 -timeout 20m -p 1 -run "$ATTACKS" "${attack[@]}" || rc=1
fi
exit $rc
