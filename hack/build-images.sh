#!/usr/bin/env bash
# Builds the images Kurma ships from this repo into $BIN/images. Each section
# below belongs to one capability.
set -euo pipefail
BIN=${1:?bin dir}
cd "$(dirname "$0")/.."
mkdir -p "$BIN/images" "$BIN/keys"

# --- image tooling (internal/image, cmd/kurma-acbuild; owner: images) ---
# bin/keys/stager.key (0600) and stager.pub: the ed25519 key pair that signs
# the stager image; the daemon trusts stager.pub (docs/image-trust.md).
# build_aci OUT NAME EXEC [acbuild build flags...] -- SRC:DST...
#   builds OUT (an ACI) named NAME running EXEC ("" for none) from host
#   files; flags before "--" go to `kurma-acbuild build` as they are.
# sign_aci OUT: writes OUT.sig with bin/keys/stager.key.
build_aci() {
  local out=${1:?out} name=${2:?name} exec=${3-} flags=() adds=()
  shift 3
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
  [ "${1-}" = "--" ] && shift
  for a in "$@"; do adds+=(--add "$a"); done
  [ -n "$exec" ] && flags+=(--exec "$exec")
  "$BIN/kurma-acbuild" build -o "$out" --name "$name" "${flags[@]}" "${adds[@]}" >/dev/null
}
sign_aci() {
  "$BIN/kurma-acbuild" sign --key "$BIN/keys/stager.key" "${1:?aci}"
}
if [ ! -s "$BIN/keys/stager.key" ] || [ ! -s "$BIN/keys/stager.pub" ]; then
  [ -x "$BIN/kurma-acbuild" ] || { echo "keys: $BIN/kurma-acbuild missing (make binaries)" >&2; exit 1; }
  rm -f "$BIN/keys/stager.key" "$BIN/keys/stager.pub"
  "$BIN/kurma-acbuild" keygen -o "$BIN/keys/stager"
  echo "generated $BIN/keys/stager.key and stager.pub"
fi
# --- end image tooling ---

# --- network plugin image (internal/network/netplugin; owner: networking) ---
# bin/images/kurma-netplugin.aci: the default network plugin. One static
# binary is the main exec (/netplugin) and, copied, /opt/network/add and
# /opt/network/del; the pinned upstream CNI plugins go to /opt/cni/bin; the
# libcni cache and locks live in /var/lib/kurma-network (a persistent volume
# in the networking pod). The image asks for host privilege with the
# annotation kurma.dev/host-privileged=true (docs/networking.md).

# plugin_image OUT NAME CNI_DIR [ACBUILD_ARGS...]: a network plugin image
# around the default plugin's binary (main exec /netplugin and, copied,
# /opt/network/add and /opt/network/del) with CNI_DIR as /opt/cni/bin and
# an empty /var/lib/kurma-network, asking for host privilege.
plugin_image() {
  local out=$1 name=$2 cni=$3 stage
  shift 3
  stage=$(mktemp -d)
  mkdir -p "$stage/state"
  if ! "$BIN/kurma-acbuild" build -o "$out" --name "$name" --gzip \
    --exec /netplugin --annotation kurma.dev/host-privileged=true \
    --env PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@" \
    --label os=linux --label arch="$(go env GOARCH)" \
    --add "$BIN/kurma-netplugin:/netplugin" \
    --add "$BIN/kurma-netplugin:/opt/network/add" \
    --add "$BIN/kurma-netplugin:/opt/network/del" \
    --add "$cni:/opt/cni/bin" \
    --add "$stage/state:/var/lib/kurma-network" >/dev/null; then
    rm -rf "$stage"
    return 1
  fi
  rm -rf "$stage"
  echo "built $out"
}

netplugin_image() {
  local stage rc
  for f in kurma-netplugin kurma-acbuild cni/bridge cni/host-local; do
    [ -e "$BIN/$f" ] || { echo "netplugin image: $BIN/$f missing (make binaries tools)" >&2; return 1; }
  done
  stage=$(mktemp -d)
  mkdir -p "$stage/root"
  # The bridge plugin's ipMasq needs nft (knftables drives the binary): copy
  # the host's nft with the shared libraries it links, at their own paths.
  local nft extra=()
  if nft=$(command -v nft); then
    for f in "$nft" $(ldd "$nft" | grep -o '/[^ ]*'); do
      mkdir -p "$stage/root$(dirname "$f")" && cp -L "$f" "$stage/root$f"
    done
    for d in "$stage"/root/*; do extra+=(--add "$d:/$(basename "$d")"); done
  else
    echo "netplugin image: nft not found; ipMasq will not work in the image" >&2
  fi
  plugin_image "$BIN/images/kurma-netplugin.aci" kurma.dev/netplugin "$BIN/cni" "${extra[@]}"
  rc=$?
  rm -rf "$stage"
  return $rc
}
netplugin_image
# --- end network plugin image ---

# --- mizarmp network plugin image (plugins/mizarmp; owner: cniperf) ---
# bin/images/kurma-netplugin-mizarmp.aci: the default plugin's binary as
# main exec and /opt/network/add|del (it drives any CNI plugin through
# libcni), with the mizarmp CNI plugin alone in /opt/cni/bin, so a
# pod_networks entry of type "mizarmp" attaches pods to a Kurma controller
# network (test/e2e TestMizarmpNetworkE2E). Host-privileged like the
# default image: the agent plugs the port, but the plugin still runs with
# host networking to reach the controller on the host's loopback.
mizarmp_netplugin_image() {
  local stage rc
  for f in kurma-netplugin kurma-acbuild mizarmp; do
    [ -e "$BIN/$f" ] || { echo "mizarmp image: $BIN/$f missing (make binaries)" >&2; return 1; }
  done
  stage=$(mktemp -d)
  cp "$BIN/mizarmp" "$stage/mizarmp"
  plugin_image "$BIN/images/kurma-netplugin-mizarmp.aci" kurma.dev/netplugin-mizarmp "$stage"
  rc=$?
  rm -rf "$stage"
  return $rc
}
mizarmp_netplugin_image
# --- end mizarmp network plugin image ---

# --- test and demo images (internal/pod; owner: daemon core) ---
# bin/images/busybox.aci (+ the same as an OCI layout bin/images/busybox-oci/
# and a docker-save tarball bin/images/busybox.tar) from Debian's
# busybox-static, with applet symlinks; bin/images/hello.aci: the demo app
# (examples/hello), with busybox beside it for exec.
pod_test_images() {
  local stage bb=/bin/busybox a
  [ -x "$BIN/kurma-acbuild" ] || { echo "test images: $BIN/kurma-acbuild missing (make binaries)" >&2; return 1; }
  [ -x "$bb" ] || { echo "test images: $bb missing (apt-get install busybox-static)" >&2; return 1; }
  stage=$(mktemp -d)
  trap 'rm -rf "${stage:-}"; trap - RETURN' RETURN
  mkdir -p "$stage/bb/bin" "$stage/bb/tmp"
  cp "$bb" "$stage/bb/bin/busybox"
  for a in sh echo cat sleep ls ps true false hostname wc id; do
    ln -s busybox "$stage/bb/bin/$a"
  done
  "$BIN/kurma-acbuild" build -o "$BIN/images/busybox.aci" --name kurma.dev/busybox \
    --exec /bin/sh --env PATH=/bin --label os=linux --label arch="$(go env GOARCH)" \
    --add "$stage/bb/bin:/bin" --add "$stage/bb/tmp:/tmp" >/dev/null
  rm -rf "$BIN/images/busybox-oci" "$BIN/images/busybox.tar"
  "$BIN/kurma-acbuild" oci-layout -o "$BIN/images/busybox-oci" --from-aci "$BIN/images/busybox.aci" \
    --tag kurma.dev/busybox:latest >/dev/null
  "$BIN/kurma-acbuild" oci-layout -o "$BIN/images/busybox.tar" --from-aci "$BIN/images/busybox.aci" \
    --tag kurma.dev/busybox:latest --tarball >/dev/null
  CGO_ENABLED=0 go build -trimpath -o "$stage/hello" ./examples/hello
  "$BIN/kurma-acbuild" build -o "$BIN/images/hello.aci" --name kurma.dev/hello \
    --exec /hello --env PATH=/bin --port http:tcp:8080 \
    --label os=linux --label arch="$(go env GOARCH)" \
    --add "$stage/bb/bin:/bin" --add "$stage/bb/tmp:/tmp" --add "$stage/hello:/hello" >/dev/null
  echo "built $BIN/images/busybox.aci, busybox-oci/, busybox.tar and hello.aci"
}
pod_test_images
# --- end test and demo images ---

# --- default stager image (internal/stager; owner: stager) ---
# bin/images/kurma-stager.aci: one static binary as the stager's exec
# (/stager) and, copied, the call-ins /opt/stager/{status,logs,run,attach}
# (the binary dispatches on its basename). No dependencies, as the stager
# spec requires. Signed with bin/keys/stager.key (made by the image tooling
# section above; the daemon trusts stager.pub) into kurma-stager.aci.sig.
# It declares kurma.dev/stager-prestart=true: kurmad may start it before
# its pod exists (docs/stager.md, "Pre-started stagers").
stager_image() {
  local out="$BIN/images/kurma-stager.aci" c adds=()
  for f in kurma-stager kurma-acbuild keys/stager.key; do
    [ -e "$BIN/$f" ] || { echo "stager image: $BIN/$f missing (make binaries)" >&2; return 1; }
  done
  for c in status logs run attach; do adds+=(--add "$BIN/kurma-stager:/opt/stager/$c"); done
  "$BIN/kurma-acbuild" build -o "$out" --name kurma.dev/stager --gzip \
    --exec /stager --user 0 --group 0 \
    --annotation kurma.dev/stager-prestart=true \
    --label os=linux --label arch="$(go env GOARCH)" \
    --add "$BIN/kurma-stager:/stager" "${adds[@]}" >/dev/null
  sign_aci "$out"
  echo "built $out"
}
stager_image
# --- end default stager image ---

# --- Kubernetes test images (internal/testutil/kubecluster; owner: k8s-cluster) ---
# bin/images/k8s-pause.tar and k8s-echo.tar: docker-save image tarballs of
# the static programs under test/k8simages, named kurma.dev/k8s-pause:latest
# and kurma.dev/k8s-echo:latest. No registry is reachable in CI; the test
# clusters `ctr images import` them into their own containerd, whose CRI
# uses k8s-pause as the sandbox image.
k8s_test_images() {
  local stage p
  [ -x "$BIN/kurma-acbuild" ] || { echo "k8s images: $BIN/kurma-acbuild missing (make binaries)" >&2; return 1; }
  stage=$(mktemp -d)
  trap 'rm -rf "${stage:-}"; trap - RETURN' RETURN
  for p in pause echo; do
    CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$stage/$p" ./test/k8simages/$p
    "$BIN/kurma-acbuild" oci-layout -o "$BIN/images/k8s-$p.tar" --tarball --name kurma.dev/k8s-$p \
      --tag kurma.dev/k8s-$p:latest --exec /$p --label os=linux --label arch="$(go env GOARCH)" \
      --add "$stage/$p:/$p" >/dev/null
  done
  echo "built $BIN/images/k8s-pause.tar and k8s-echo.tar"
}
k8s_test_images
# --- end Kubernetes test images ---
