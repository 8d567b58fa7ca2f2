#!/usr/bin/env bash
# make test's Go tests, in two lanes at once (make test builds bin/wb-test and the rest first).
#
# go test's -p bounds builds and test binaries together: two on two cores. The packages that
# mostly wait (on Chromium in gVisor guests, on a fleet's timers) held both places for minutes
# of a cold run while the compiler waited for one (desktop and desktop/guest ran side by side
# for 236 s). So those packages (WAITING) are compiled first, then run one at a time in a lane
# of their own while go test builds and runs the rest two at a time, as before: the CPU-bound
# timing tests never have more than one other package beside them and a waiting one.
#
# Then the attacks (fork bombs, floods, starved guests), after both lanes and one package at a
# time, so that no timing test (idle deadlines, pause, checkpoint) runs beside them.
#
# PKGS (default ./...) limits it, as go test's arguments would.
set -uo pipefail
GO=${GO:-go}
PKGS=${PKGS:-./...}
WAITING=(wb/conformance/chaos wb/desktop wb/desktop/guest)
ATTACKS='^(TestAdversarial|TestExhaustion)$'

mapfile -t all < <("$GO" list $PKGS) || exit 1
waiting=() rest=()
for p in "${all[@]}"; do
	if printf '%s\n' "${WAITING[@]}" | grep -qxF "$p"; then waiting+=("$p"); else rest+=("$p"); fi
done

bins=$(mktemp -d /tmp/wb-test-bins.XXXXXX)
logs=$(mktemp -d /tmp/wb-test-logs.XXXXXX)
trap 'rm -rf "$bins" "$logs"' EXIT

# runWaiting runs each waiting package's test binary in its directory, as go test would, and
# prints go test's line for it (its whole output when it fails). Answers 1 if any failed.
runWaiting() {
	local rc=0 p dir log start
	for p in "${waiting[@]}"; do
		dir=$("$GO" list -f '{{.Dir}}' "$p") || return 1
		log="$logs/$(echo "$p" | tr / _).log"
		start=$(date +%s)
		if (cd "$dir" && "$bins/$(basename "$p").test" -test.count=1 -test.timeout=20m \
			-test.skip "$ATTACKS" >"$log" 2>&1); then
			printf 'ok  \t%s\t%ds\n' "$p" $(($(date +%s) - start))
		else
			cat "$log"
			printf 'FAIL\t%s\t%ds\n' "$p" $(($(date +%s) - start))
			rc=1
		fi
	done
	return $rc
}

rc=0
if [ ${#waiting[@]} -gt 0 ]; then
	# -vet=off: make lint runs every analyzer.
	"$GO" test -vet=off -race -c -ldflags='-s -w' -o "$bins/" "${waiting[@]}" || exit 1
	runWaiting &
	lane=$!
fi
if [ ${#rest[@]} -gt 0 ]; then
	"$GO" test -vet=off -race -count=1 -timeout 20m -skip "$ATTACKS" "${rest[@]}" || rc=1
fi
if [ ${#waiting[@]} -gt 0 ]; then
	wait $lane || rc=1
fi
attack=()
for p in "${all[@]}"; do
	case $p in wb/node | wb/conformance) attack+=("$p") ;; esac
done
if [ ${#attack[@]} -gt 0 ]; then
	"$GO" test -vet=off -race -count=1 -timeout 20m -p 1 -run "$ATTACKS" "${attack[@]}" || rc=1
fi
exit $rc
