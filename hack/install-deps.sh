#!/usr/bin/env bash
# Installs the Debian packages of hack/apt-packages.txt (what kurmad and
# `make demo` need) that are not installed yet; with the argument "test",
# also those of hack/apt-packages-test.txt (podman, runc, containerd: peers
# that only the tests and benchmarks use). Idempotent and quiet when nothing
# is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
lists=(hack/apt-packages.txt)
case "${1:-}" in
  "") ;;
  test) lists+=(hack/apt-packages-test.txt) ;;
  *) echo "usage: $0 [test]" >&2; exit 2 ;;
esac
mapfile -t pkgs < <(sed -e 's/#.*//' -e '/^\s*$/d' "${lists[@]}")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ -x hack/configure-host.sh ]; then hack/configure-host.sh; fi
exit 0
