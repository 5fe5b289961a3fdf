#!/usr/bin/env bash
# kurma-reset: remove what kurmad made on this host, with kurmad stopped.
# Pods outlive kurmad, so this ends them first. In order:
#   1. SIGKILL every process of the pods under the pods folder (their
#      cgroups <hierarchy>/<cgroup root>/<pod uuid>) and remove those
#      cgroups, then the cgroup root where it is left empty;
#   2. unmount whatever is mounted under the state and run folders (the
#      pods' netns binds, the networking pod's netns folder);
#   3. delete the masquerade rules the default network made for those pods
#      (nft table inet cni_plugins_masquerade), and the table once it holds
#      no masquerade rule;
#   4. delete the default network's bridge (kurma0);
#   5. remove the state folder (/var/lib/kurma: pods, images, volumes), the
#      run folder (/run/kurma: socket, netns) and the default network's
#      IPAM folder (/var/lib/kurma-network).
# It refuses to run while a kurmad serves the socket.
#
# Usage: kurma-reset [-n]   (-n: print what would be done, change nothing)
# Environment (for a kurmad configured elsewhere; an empty value skips):
#   KURMA_STATE_DIR=/var/lib/kurma  KURMA_PODS_DIR=$KURMA_STATE_DIR/pods
#   KURMA_RUN_DIR=/run/kurma        KURMA_NETWORK_STATE=/var/lib/kurma-network
#   KURMA_BRIDGE=kurma0             KURMA_CGROUP_ROOT=kurma
#   KURMA_MASQ_TABLE=cni_plugins_masquerade
set -euo pipefail
STATE=${KURMA_STATE_DIR-/var/lib/kurma}
PODS=${KURMA_PODS_DIR-${STATE:+$STATE/pods}}
RUN=${KURMA_RUN_DIR-/run/kurma}
NETSTATE=${KURMA_NETWORK_STATE-/var/lib/kurma-network}
BRIDGE=${KURMA_BRIDGE-kurma0}
CGROOT=${KURMA_CGROUP_ROOT-kurma}
MASQ=${KURMA_MASQ_TABLE-cni_plugins_masquerade}
dry=
[ "${1:-}" = -n ] && dry=1
[ $# -eq 0 ] || [ "$1" = -n ] || { echo "usage: $0 [-n]" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "kurma-reset: run as root" >&2; exit 1; }
do_() { echo "+ $*"; [ -n "$dry" ] || "$@"; }

if [ -n "$RUN" ] && [ -S "$RUN/kurma.sock" ] && ss -xlH 2>/dev/null | grep -qF " $RUN/kurma.sock "; then
  echo "kurma-reset: a kurmad serves $RUN/kurma.sock; stop it first" >&2
  exit 1
fi

# 1. The pods' processes and cgroups.
uuids=()
if [ -n "$PODS" ] && [ -d "$PODS" ]; then
  for d in "$PODS"/*/; do
    u=$(basename "$d")
    [[ $u =~ ^[0-9a-f-]{36}$ ]] && uuids+=("$u")
  done
fi
hier=(/sys/fs/cgroup)
for h in /sys/fs/cgroup/*/; do [ -f "$h/cgroup.procs" ] && hier+=("${h%/}"); done
if [ -n "$CGROOT" ]; then
  for u in "${uuids[@]}"; do
    for h in "${hier[@]}"; do
      cg="$h/$CGROOT/$u"
      [ -d "$cg" ] || continue
      for try in $(seq 1 100); do
        pids=$(find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u)
        [ -z "$pids" ] && break
        [ "$try" = 1 ] && echo "+ kill -9 $(echo $pids)"
        [ -n "$dry" ] && break
        kill -9 $pids 2>/dev/null || true
        sleep 0.05
      done
      # Deepest first: a cgroup with children cannot be removed.
      find "$cg" -depth -type d | while read -r d; do do_ rmdir "$d" || true; done
    done
  done
  for h in "${hier[@]}"; do
    [ -d "$h/$CGROOT" ] || continue
    if [ -z "$(find "$h/$CGROOT" -mindepth 1 -maxdepth 1 -type d)" ]; then do_ rmdir "$h/$CGROOT" || true; fi
  done
fi

# 2. Mounts under the state and run folders, deepest first.
for dir in "$STATE" "$RUN"; do
  [ -n "$dir" ] || continue
  awk -v d="$dir" '{ m = $5; gsub(/\\040/, " ", m); if (m == d || index(m, d "/") == 1) print m }' /proc/self/mountinfo |
    sort -r | uniq | while read -r m; do do_ umount -l "$m" || true; done
done

# 3. The default network's masquerade rules for these pods.
if [ -n "$MASQ" ] && nft list table inet "$MASQ" >/dev/null 2>&1; then
  for u in "${uuids[@]}"; do
    nft -a list table inet "$MASQ" | awk -v id="id: $u\"" '/^\tchain /{c=$2} index($0, id) && /# handle /{print c, $NF}' |
      while read -r chain handle; do do_ nft delete rule inet "$MASQ" "$chain" handle "$handle"; done
  done
  if ! nft list table inet "$MASQ" | grep -q ' masquerade'; then do_ nft delete table inet "$MASQ"; fi
fi

# 4. The default network's bridge.
if [ -n "$BRIDGE" ] && ip link show "$BRIDGE" >/dev/null 2>&1; then do_ ip link del "$BRIDGE"; fi

# 5. The folders.
for dir in "$STATE" "$RUN" "$NETSTATE"; do
  if [ -n "$dir" ] && [ -e "$dir" ]; then do_ rm -rf --one-file-system "$dir"; fi
done
echo "kurma-reset: done"
