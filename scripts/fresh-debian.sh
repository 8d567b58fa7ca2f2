#!/usr/bin/env bash
# make test as a newcomer's fresh Debian 12 runs it: debootstrap --variant=minbase into DIR, with
# only what a newcomer brings (git, make, ca-certificates, and Go: this host's GOROOT, bound
# read-only), a clone of this repository's HEAD in it, then `make test` as the root of a private
# mount namespace: pivot_root, not chroot, since a chrooted process may not create the user
# namespaces that runc's guests need. make test installs the rest (scripts/deps.sh), as it
# would there. Each line of its output is prefixed with the seconds since make test started;
# the exit code is make test's.
#
# Usage (root): scripts/fresh-debian.sh [DIR]   (default /var/tmp/wb-fresh; removed after,
# unless KEEP=1). PKGS limits the Go packages, as for make test. Needs debootstrap and the
# network to Debian's mirror, the Go module proxy and npm. This host's extra CA certificates
# (/usr/local/share/ca-certificates) are copied in, for a proxy that re-signs TLS.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "fresh-debian.sh: run as root (debootstrap, mounts)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "fresh-debian.sh: apt-get install debootstrap" >&2; exit 1; }
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-/var/tmp/wb-fresh}
goroot=$(go env GOROOT)
[ ! -e "$dir" ] || { echo "fresh-debian.sh: $dir exists; remove it or name another" >&2; exit 1; }
cleanup() { [ "${KEEP:-}" = 1 ] || rm -rf "$dir"; }
trap cleanup EXIT

log=$(mktemp)
debootstrap --variant=minbase bookworm "$dir" http://deb.debian.org/debian >"$log" 2>&1 ||
	{ tail -20 "$log"; rm -f "$log"; exit 1; }
rm -f "$log"
mkdir -p "$dir/usr/local/share/ca-certificates"
cp /usr/local/share/ca-certificates/*.crt "$dir/usr/local/share/ca-certificates/" 2>/dev/null || true
# What a newcomer brings besides Go; not timed.
unshare --mount --propagation private chroot "$dir" sh -c 'mount -t proc proc /proc &&
	DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends git make ca-certificates >/dev/null &&
	update-ca-certificates >/dev/null' || exit 1
git clone -q "$repo" "$dir/root/wb"
mkdir -p "$dir$goroot" "$dir/.oldroot"
cat >"$dir/root/run.sh" <<EOF
#!/bin/bash
export PATH=$goroot/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
export SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
${PKGS:+export PKGS='$PKGS'}
cd /root/wb
start=\$(date +%s)
make test 2>&1 | while IFS= read -r l; do echo "\$(( \$(date +%s) - start ))s \$l"; done
rc=\${PIPESTATUS[0]}
# A run that failed early leaves scripts/deps.sh's apt to finish (see scripts/test.sh): wait
# for it before DIR goes.
while grep -qsxE 'apt-get|dpkg' /proc/[0-9]*/comm; do sleep 1; done
exit \$rc
EOF
chmod +x "$dir/root/run.sh"

unshare --mount --propagation private bash -c '
set -e
dir=$1 goroot=$2
mount --bind "$dir" "$dir"
mount -t proc proc "$dir/proc"
mount --rbind /sys "$dir/sys"
mount --rbind /dev "$dir/dev"
mount --bind "$goroot" "$dir$goroot"
mount -o remount,bind,ro "$dir$goroot"
cd "$dir"
pivot_root . .oldroot
cd /
umount -l /.oldroot
exec /root/run.sh
' fresh-debian "$dir" "$goroot"
