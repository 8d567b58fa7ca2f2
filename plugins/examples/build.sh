#!/usr/bin/env bash
# Builds every example plugin into plugins/examples/bin/NAME.wasm (a WASI reactor).
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p bin
for dir in */; do
	name=${dir%/}
	[ -f "$name/main.go" ] || continue
	GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 go build -buildmode=c-shared -trimpath -o "bin/$name.wasm" "./$name"
	echo "bin/$name.wasm"
done
