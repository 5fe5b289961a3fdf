#!/usr/bin/env bash
# Builds the images Kurma ships from this repo into $BIN/images. Each section
# below belongs to one capability.
set -euo pipefail
BIN=${1:?bin dir}
cd "$(dirname "$0")/.."
mkdir -p "$BIN/images" "$BIN/keys"
