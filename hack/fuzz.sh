#!/usr/bin/env bash
# Runs every Go fuzz target in the module for a short time each.
set -euo pipefail
cd "$(dirname "$0")/.."
t=${1:-20s}
grep -rl --include='*_test.go' '^func Fuzz' . | while read -r f; do
  pkg=./$(dirname "${f#./}")
  for fn in $(grep -oE '^func Fuzz[A-Za-z0-9_]+' "$f" | cut -d' ' -f2); do
    echo "== $pkg $fn"
    go test -run '^$' -fuzz "^$fn\$" -fuzztime "$t" "$pkg"
  done
done
