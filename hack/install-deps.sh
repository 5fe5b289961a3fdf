#!/usr/bin/env bash
# Installs the Debian packages listed in hack/apt-packages.txt that are not
# installed yet. Idempotent and quiet when nothing is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t pkgs < <(sed -e 's/#.*//' -e '/^\s*$/d' hack/apt-packages.txt)
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
[ -x hack/configure-host.sh ] && hack/configure-host.sh
exit 0
