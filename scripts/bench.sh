#!/usr/bin/env bash
# make bench: every package's benchmarks, their output appended to BENCH_OUT (bin/bench.txt),
# then one table of it (internal/benchtable): each figure beside its baseline measured in the
# same run, and their ratio; the table is also written to BENCH_TABLE (bin/bench-table.txt).
# A package whose benchmarks fail does not stop the others: the table shows what ran, and the
# script exits 1 naming what failed.
set -uo pipefail
GO=${GO:-go}
out=${BENCH_OUT:-bin/bench.txt}
table=${BENCH_TABLE:-bin/bench-table.txt}
mkdir -p "$(dirname "$out")" "$(dirname "$table")"
: >"$out"
failed=()

# bench ENV... -- runs go test's benchmarks with ENV (NAME=VALUE…) and the rest as arguments;
# past go test's default 10 minutes, which the conformance benchmarks can take on a busy machine.
bench() {
	local env=()
	while [ "$1" != "--" ]; do env+=("$1"); shift; done
	shift
	echo "+ ${env[*]} $GO test -run '^\$' -bench . -timeout 40m $*"
	env "${env[@]}" "$GO" test -run '^$' -bench . -timeout 40m "$@" 2>&1 | tee -a "$out" || failed+=("$*")
}

# The store (beside redis-benchmark's SET on a redis-server of its own), plugins, netguard.
bench -- -benchmem -benchtime 2s ./store/ ./plugins/ ./internal/netguard/
# xds: snapshot build for 1,000 nodes; xDS pushes per minute under 100 session creates/s.
bench -- -benchmem -benchtime 2s ./xds/
# The gateway and policies as wb runs them: cmd/wb sets GOGC 400.
bench GOGC=400 -- -benchmem -benchtime 2s ./gateway/ ./policies/
bench -- -benchtime 200000x ./quota/
# The placer: one placement at a time, beside a PING.
bench -- -benchtime 2000x ./placer/
# The OCI driver beside the bare runtime on the same root file system (`runc run`/`runsc run`;
# pause + resume; runsc checkpoint, delete, restore); the platform's sessions and runs (beside
# those, and a bare python3 on the host).
bench -- -benchtime 20x ./hypervisor/oci/ ./conformance/
# Desktops: sleep, and wake to the first MCP answer, beside a session's memory snapshot and restore.
bench -- -benchtime 5x ./desktop/
# Cloud Hypervisor: the client's own cost per call, beside a hand-written HTTP round trip;
# the driver's lifecycle calls on a guest of the fake VMM, beside the bare API calls.
bench -- -benchmem -benchtime 2s ./hypervisor/cloudhv/chapi/
bench -- -benchtime 200x ./hypervisor/cloudhv/

echo
"$GO" run ./internal/benchtable/cmd/benchtable "$out" | tee "$table" || failed+=("the table")
if [ ${#failed[@]} -gt 0 ]; then
	printf 'make bench: failed: %s\n' "${failed[@]}" >&2
	exit 1
fi
