#!/usr/bin/env bash
# Installs what wb's tests and `wb serve` need from Debian's packages, when missing.
# With --missing it installs nothing: it prints the missing packages' names, and fails when
# there are some that this user cannot install (make test checks first, then installs them in
# the background while it builds).
set -euo pipefail
need=()
# go test -race needs cgo, and cgo a C compiler and libc's headers: without them a fresh Debian
# answers "-race requires cgo".
command -v "${CC:-gcc}" >/dev/null || need+=(gcc)
[ -e /usr/include/stdio.h ] || need+=(libc6-dev)
# The cloudhv backend sets up each guest's network (a tap device) with ip.
command -v ip >/dev/null || need+=(iproute2)
# The templates' python (tpl_dev_polyglot, tier-1 python runs and their waiting runner) is the
# host's /usr/bin/python3, bound into the guests.
[ -x /usr/bin/python3 ] || need+=(python3)
command -v redis-server >/dev/null || need+=(redis-server)
# make bench's baseline for the store: redis-benchmark (store BenchmarkRedisBenchmarkSet).
command -v redis-benchmark >/dev/null || need+=(redis-tools)
# ... and for the gateway's saturated creates beside it: wrk (gateway BenchmarkCreateSaturated).
command -v wrk >/dev/null || need+=(wrk)
# ... and for ext_authz's Checks as Envoy sends them: h2load (gateway BenchmarkAuthzCheckH2load).
command -v h2load >/dev/null || need+=(nghttp2-client)
command -v runsc >/dev/null || need+=(runsc)
command -v runc >/dev/null || need+=(runc)
[ -x /bin/busybox ] || [ -x /usr/bin/busybox ] || need+=(busybox-static)
# The desktop guest (tpl_desktop): an X display, a small window manager, Chromium, and xwd
# for screenshots.
[ -x /usr/bin/Xvfb ] || need+=(xvfb)
[ -x /usr/bin/matchbox-window-manager ] || need+=(matchbox-window-manager)
[ -x /usr/lib/chromium/chromium ] || need+=(chromium)
[ -x /usr/bin/xwd ] || need+=(x11-apps)
[ -d /usr/share/fonts/truetype/dejavu ] || need+=(fonts-dejavu-core)
# The TypeScript SDK's build and tests (sdk/ts: npm ci, npm test).
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
# The CLI's interactive-terminal test drives `wb pty` inside tmux (internal/cli).
command -v tmux >/dev/null || need+=(tmux)
if ((${#need[@]})); then
  if [ "$(id -u)" != 0 ]; then
    echo "missing: ${need[*]}; run as root or: sudo apt-get install -y ${need[*]}" >&2
    exit 1
  fi
  if [ "${1:-}" = --missing ]; then
    echo "${need[*]}"
    exit 0
  fi
  echo "installing: ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# The Debian package starts a system redis-server; the tests start their own.
