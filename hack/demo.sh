#!/usr/bin/env bash
# Kurma demo (`make demo`): a real end-to-end run on the embedded defaults —
# no config file. Starts kurmad in the background (socket
# /run/kurma/kurma.sock, state in /var/lib/kurma), runs the demo app in a pod,
# shows ps, exec, logs and status, networking (the networking pod, a second
# pod, both pods' IPs, one reaching the other over TCP), stops and removes
# the pods, then stops kurmad. It cleans up after itself (pods, the daemon, and the state and
# socket directories when it created them) and exits non-zero on any failure.
set -euo pipefail
BIN=$(cd "${1:-$(dirname "$0")/../bin}" && pwd)
KURMAD="$BIN/kurmad"
KURMA="$BIN/kurma"
SOCK=/run/kurma/kurma.sock
STATE=/var/lib/kurma
POD=kurma-demo
POD2=kurma-demo-2
export KURMA_SOCKET=$SOCK
export PATH="$BIN:$PATH"

bold=$'\033[1m' off=$'\033[0m'
[ -t 1 ] || { bold=; off=; }
heading() { printf '\n%s== %s%s\n' "$bold" "$*" "$off"; }
quote() {
  if [[ $1 =~ ^[A-Za-z0-9_./:=@%+-]+$ ]]; then printf ' %s' "$1"
  else printf " '%s'" "${1//\'/\'\\\'\'}"; fi
}
show() { printf '$'; for a in "$@"; do quote "$a"; done; printf '\n'; "$@"; }

[ "$(id -u)" = 0 ] || { echo "demo: run as root (kurmad makes namespaces and mounts)" >&2; exit 1; }
for f in "$KURMAD" "$KURMA"; do
  [ -x "$f" ] || { echo "demo: $f missing; run make build" >&2; exit 1; }
done
IMAGE=
for f in hello.aci busybox.aci; do
  if [ -f "$BIN/images/$f" ]; then IMAGE=$BIN/images/$f; break; fi
done
[ -n "$IMAGE" ] || { echo "demo: no demo image in $BIN/images; run make build" >&2; exit 1; }
if "$KURMA" version >/dev/null 2>&1; then
  echo "demo: a kurmad is already serving $SOCK; stop it first" >&2
  exit 1
fi

made_state=; made_run=; made_bridge=; made_ipam=; made_masq=
[ -e "$STATE" ] || made_state=1
[ -e /run/kurma ] || made_run=1
# The default network's bridge and IPAM store: removed again if we made them.
ip link show kurma0 >/dev/null 2>&1 || made_bridge=1
[ -e /var/lib/kurma-network ] || made_ipam=1
# The upstream bridge plugin (ipMasq) makes this shared table and never
# removes it; remove it afterwards if the demo made it.
nft list table inet cni_plugins_masquerade >/dev/null 2>&1 || made_masq=1
# The bridge plugin (isGateway) turns on forwarding: put the old values back.
FWD_SYSCTLS="net.ipv4.ip_forward net.ipv6.conf.all.forwarding net.ipv6.conf.default.forwarding"
declare -A fwd_before=()
for s in $FWD_SYSCTLS; do fwd_before[$s]=$(sysctl -n "$s" 2>/dev/null || true); done
LOG=$(mktemp /tmp/kurmad-demo.XXXXXX.log)
KPID=
cleanup() {
  rc=$?
  set +e
  if [ -n "$KPID" ] && kill -0 "$KPID" 2>/dev/null; then
    "$KURMA" rm -f "$POD" "$POD2" >/dev/null 2>&1
    kill -TERM "$KPID"
    wait "$KPID" 2>/dev/null
  fi
  if [ $rc -ne 0 ]; then
    echo "demo FAILED (exit $rc); kurmad log:" >&2
    tail -n 40 "$LOG" >&2
  fi
  [ -n "$made_state" ] && rm -rf "$STATE"
  # kurmad keeps /run/kurma/netns mounted (shared) for the networking pod.
  [ -n "$made_run" ] && { umount /run/kurma/netns 2>/dev/null; rm -rf /run/kurma; }
  [ -n "$made_bridge" ] && ip link del kurma0 2>/dev/null
  [ -n "$made_ipam" ] && rm -rf /var/lib/kurma-network
  [ -n "$made_masq" ] && nft delete table inet cni_plugins_masquerade 2>/dev/null
  for s in $FWD_SYSCTLS; do
    [ -n "${fwd_before[$s]}" ] && [ "$(sysctl -n "$s" 2>/dev/null)" != "${fwd_before[$s]}" ] && sysctl -qw "$s=${fwd_before[$s]}"
  done
  rm -f "$LOG"
  exit $rc
}
trap cleanup EXIT

heading "Starting kurmad with the built-in defaults (no config file)"
"$KURMAD" --log-level info >"$LOG" 2>&1 &
KPID=$!
for _ in $(seq 1 200); do
  "$KURMA" version >/dev/null 2>&1 && break
  kill -0 "$KPID" 2>/dev/null || { echo "demo: kurmad exited" >&2; exit 1; }
  sleep 0.05
done
show kurma version
ls -l "$SOCK"

heading "Running $(basename "$IMAGE") in a pod"
show kurma run -d --name "$POD" "file://$IMAGE"
sleep 2.5

heading "kurma ps"
show kurma ps

heading "kurma exec: a command inside the running app"
show kurma exec "$POD" sh -c 'echo "inside $(hostname)"; ps'

if [ "$(basename "$IMAGE")" = hello.aci ]; then
  heading "kurma exec: the app answers inside its pod"
  show kurma exec "$POD" busybox wget -qO- http://127.0.0.1:8080/
fi

heading "Networking: the plugins run in the networking pod"
show kurma net ls
show kurma run -d --name "$POD2" "file://$IMAGE"
ip_of() { "$KURMA" inspect "$1" | grep -o '"address": *"[0-9.]*' | head -n 1 | grep -o '[0-9.]*$'; }
IP1=$(ip_of "$POD") IP2=$(ip_of "$POD2")
echo "$POD: $IP1    $POD2: $IP2"
[ -n "$IP1" ] && [ -n "$IP2" ] && [ "$IP1" != "$IP2" ] || { echo "demo: pods have no distinct IPs" >&2; exit 1; }
if [ "$(basename "$IMAGE")" = hello.aci ]; then
  sleep 1
  show kurma exec "$POD2" busybox wget -qO- "http://$IP1:8080/"
fi
show kurma rm -f "$POD2"

heading "kurma logs"
show kurma logs "$POD"

heading "kurma status"
show kurma status "$POD"

heading "kurma run --rm: a one-shot pod, its output and its exit code"
set +e
"$KURMA" run --rm "file://$IMAGE" sh -c 'echo "one-shot pod says hi"; exit 3'
code=$?
set -e
echo "exit code: $code"
[ "$code" = 3 ] || { echo "demo: expected exit code 3" >&2; exit 1; }

heading "Stopping and removing the pod"
show kurma stop -t 5 "$POD"
show kurma ps -a
show kurma rm "$POD"
show kurma ps -a

heading "Stopping kurmad"
kill -TERM "$KPID"
wait "$KPID"
KPID=
echo "done."
