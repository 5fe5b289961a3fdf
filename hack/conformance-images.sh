#!/usr/bin/env bash
# Builds the offline images of the upstream e2e suite for test/conformance
# (make conformance-images), into $BIN/images:
#   conformance-agnhost.tar  agnhost (Entrypoint /agnhost, Cmd pause) with
#     /localhost.crt and /localhost.key from agnhost's source tree, and the
#     tools the specs exec inside it (nc, dig, nslookup, curl, wget, getent, seq,
#     awk, ...) from Debian packages fetched with `apt-get download` and
#     unpacked (never installed on the host); dash is /bin/sh, since a
#     busybox shell's built-ins would shadow the real nc and nslookup. One
#     image under every name the sig-network specs ask for
#     (test/utils/image/manifest.go at v1.37.1).
#     It is also distroless-iptables, which the spec "KubeProxy should set
#     TCP CLOSE_WAIT timeout" runs as a host-network pod to read
#     /proc/net/nf_conntrack (cat, grep, sleep).
#   conformance-coredns.tar  the trimmed CoreDNS of hack/coredns (also
#     /coredns in the agnhost image, as upstream's agnhost has it).
#   conformance-r74839.tar  regression-issue-74839 (the server of the spec
#     "proxy implementation should not be vulnerable to the invalid
#     conntrack state bug"), built from its source in the e2e module.
# The Debian packages are cached under $CACHE_ROOT keyed by their versions.
set -euo pipefail
BIN=${1:?bin dir}
CACHE_ROOT=${CACHE_ROOT:-/var/cache/kurma-build}
cd "$(dirname "$0")/.."
mkdir -p "$BIN/images" "$CACHE_ROOT"

PKGS="dash netcat-openbsd bind9-dnsutils curl wget libc-bin coreutils grep mawk sed hostname findutils iproute2"
AGNHOST_NAMES="registry.k8s.io/e2e-test-images/agnhost:2.66.1 registry.k8s.io/e2e-test-images/agnhost:2.55
registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1 registry.k8s.io/e2e-test-images/busybox:1.37.0-2
registry.k8s.io/e2e-test-images/nginx:1.27.0-2 registry.k8s.io/e2e-test-images/nginx:1.28.0-2
registry.k8s.io/e2e-test-images/httpd:2.4.38-4 registry.k8s.io/e2e-test-images/httpd:2.4.39-4
registry.k8s.io/pause:3.10.2 registry.k8s.io/build-image/distroless-iptables:v0.9.7"
COREDNS_NAME=kurma.dev/conformance-coredns:v1.15.0
R74839_NAME=registry.k8s.io/e2e-test-images/regression-issue-74839:1.5


# The dependency closure of $PKGS, at the versions apt would fetch now.
closure() {
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
    --no-replaces --no-enhances --no-pre-depends $PKGS 2>/dev/null | grep '^[a-z0-9]' | sort -u
}
if ! apt-cache show netcat-openbsd >/dev/null 2>&1; then apt-get update -qq; fi
debs=$(closure)
versions=$(apt-cache show --no-all-versions $debs | awk '/^Package:/{p=$2} /^Version:/{print p"="$2}' | sort -u)
key=$(echo "$versions" | sha256sum | cut -c1-16)
DEBS=$CACHE_ROOT/debs-$key
if [ ! -f "$DEBS/.done" ]; then
  tmp=$(mktemp -d "$CACHE_ROOT/.tmp.XXXXXX")
  chmod 755 "$tmp"
  ( cd "$tmp" && apt-get download -qq $versions ) || { rm -rf "$tmp"; exit 1; }
  touch "$tmp/.done" && { mv -T "$tmp" "$DEBS" 2>/dev/null || rm -rf "$tmp"; }
fi

go build -trimpath -o "$BIN/mkimage" ./test/conformance/mkimage
for f in "$BIN/e2e/agnhost" "$BIN/coredns/coredns"; do
  [ -x "$f" ] || { echo "conformance images: $f missing (make e2e coredns)" >&2; exit 1; }
done

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/agnhost
mkdir -p "$root"
for d in "$DEBS"/*.deb; do dpkg-deb -x "$d" "$root"; done
rm -rf "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/info" "$root/usr/share/locale"
# What the packages' maintainer scripts would have linked (alternatives).
ln -sf dash "$root/bin/sh"
ln -sf nc.openbsd "$root/bin/nc"
ln -sf mawk "$root/usr/bin/awk"
mkdir -p "$root/etc" "$root/tmp" "$root/results"
chmod 1777 "$root/tmp"
src=$(cd hack/e2e && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/images/agnhost/porter
cp "$BIN/e2e/agnhost" "$root/agnhost"
# The DNS specs run their own DNS server pods from this image as /coredns
# (a Corefile with the hosts plugin).
cp "$BIN/coredns/coredns" "$root/coredns"
cp "$src/localhost.crt" "$src/localhost.key" "$root/"
"$BIN/mkimage" -o "$BIN/images/conformance-agnhost.tar" -root "$root" \
  -tag "$(echo $AGNHOST_NAMES | tr ' ' ',')" -entrypoint /agnhost -cmd pause

root=$stage/coredns
mkdir -p "$root/etc"
cp "$BIN/coredns/coredns" "$root/coredns"
"$BIN/mkimage" -o "$BIN/images/conformance-coredns.tar" -root "$root" -tag "$COREDNS_NAME" -entrypoint /coredns
root=$stage/r74839
mkdir -p "$root"
( cd hack/e2e && CGO_ENABLED=0 go build -trimpath -o "$root/regression-issue-74839" k8s.io/kubernetes/test/images/regression-issue-74839 )
"$BIN/mkimage" -o "$BIN/images/conformance-r74839.tar" -root "$root" -tag "$R74839_NAME" -entrypoint /regression-issue-74839
echo "built $BIN/images/conformance-agnhost.tar, conformance-coredns.tar and conformance-r74839.tar"
