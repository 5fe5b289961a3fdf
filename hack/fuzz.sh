#!/usr/bin/env bash
# Runs every Go fuzz target in the module, one at a time, for FUZZTIME each
# (first argument, default 20s; `make fuzz FUZZTIME=...`).
#
# Targets are found by scanning every *_test.go outside testdata/, vendor/,
# bin/ and hidden directories for `func FuzzXxx(f *testing.F)`. Each target
# runs under a hard timeout (FUZZTIME + FUZZ_SLACK seconds, which covers
# compiling the instrumented test binary and minimizing a crasher), so the
# whole run is bounded. A crasher does not stop the run: the script goes on
# with the other targets, then prints a summary with each failing
# package/target and the saved input (testdata/fuzz/FuzzXxx/<id> in the
# package, which `go test` then replays as a regression test) and exits 1.
#
# Environment:
#   FUZZ_SLACK    extra seconds per target before it is killed (default 240)
#   FUZZ_MINTIME  -fuzzminimizetime (default 10s): bounds time spent
#                 minimizing new-coverage inputs and crashers
#   FUZZ_PARALLEL fuzzing workers per target (default: go test's, GOMAXPROCS)
#   FUZZ_MATCH    only targets whose "pkg FuzzName" matches this ERE
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH

fuzztime=${1:-20s}
slack=${FUZZ_SLACK:-240}
mintime=${FUZZ_MINTIME:-10s}
match=${FUZZ_MATCH:-}

# Whole seconds of a Go duration such as 5s, 1m30s or 2h (0 for "100x").
seconds() {
	local d=$1 total=0 n unit
	[[ $d == *x ]] && { echo 0; return; }
	while [[ $d =~ ^([0-9]+)(h|ms|m|s)(.*)$ ]]; do
		n=${BASH_REMATCH[1]} unit=${BASH_REMATCH[2]} d=${BASH_REMATCH[3]}
		case $unit in
		h) total=$((total + n * 3600)) ;;
		m) total=$((total + n * 60)) ;;
		s) total=$((total + n)) ;;
		ms) total=$((total + (n + 999) / 1000)) ;;
		esac
	done
	[[ -z $d ]] || { echo "fuzz.sh: cannot parse duration $1" >&2; exit 2; }
	echo "$total"
}
limit=$(($(seconds "$fuzztime") + $(seconds "$mintime") + slack))

# "pkgdir FuzzName" lines, sorted, one per target.
mapfile -t targets < <(
	find . \( -name testdata -o -name vendor -o -path ./bin -o -name '.?*' \) -prune -o \
		-type f -name '*_test.go' -print |
		while read -r f; do
			grep -oE '^func Fuzz[A-Za-z0-9_]*\([A-Za-z0-9_]+ \*testing\.F\)' "$f" |
				sed -E 's/^func (Fuzz[A-Za-z0-9_]*)\(.*/\1/' |
				sed "s|^|$(dirname "$f") |"
		done | sort -u
)
if [[ -n $match ]]; then
	mapfile -t targets < <(printf '%s\n' "${targets[@]}" | grep -E -- "$match")
fi
if [[ ${#targets[@]} -eq 0 || -z ${targets[0]} ]]; then
	echo "fuzz.sh: no fuzz targets found" >&2
	exit 1
fi
echo "fuzz.sh: ${#targets[@]} targets, $fuzztime each (killed after ${limit}s)"

logdir=$(mktemp -d "${TMPDIR:-/tmp}/kurma-fuzz.XXXXXX")
trap 'rm -rf "$logdir"' EXIT
summary=()
failed=0
i=0
# run_one PKG FN LOG: one bounded fuzzing run; sets rc, took, execs, input.
run_one() {
	local pkg=$1 fn=$2 log=$3 start=$SECONDS
	# -timeout: go test's default of 10m would kill long FUZZTIMEs.
	local args=(-run '^$' -fuzz "^$fn\$" -fuzztime "$fuzztime" -fuzzminimizetime "$mintime" -timeout "${limit}s")
	[[ -n ${FUZZ_PARALLEL:-} ]] && args+=(-parallel "$FUZZ_PARALLEL")
	timeout -k 15s "${limit}s" go test "${args[@]}" "$pkg" 2>&1 | tee "$log"
	rc=${PIPESTATUS[0]}
	took=$((SECONDS - start))
	execs=$(grep -oE 'execs: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
	execs=${execs:-0}
	input=$(sed -nE 's/.*Failing input written to (.*)$/\1/p' "$log" | tail -1)
	if [[ -z $input ]]; then
		# A saved crasher that still fails when replayed as a seed.
		input=$(sed -nE 's/.*failure while testing seed corpus entry: (Fuzz[^/]*\/[^ ]+).*/testdata\/fuzz\/\1/p' "$log" | tail -1)
	fi
}

# deadline_race LOG: the run failed only because of Go's coordinator race
# at the end of -fuzztime (go.dev/issue/75804, fixed in Go 1.27): the
# target's only failure message is the fuzzing deadline, and no input was
# saved. A real hang is reported differently (the engine saves the input).
deadline_race() {
	[[ -z $input && $rc -eq 1 ]] &&
		grep -A1 -E '^--- FAIL: Fuzz' "$1" | grep -qxE '[[:space:]]+context deadline exceeded'
}

for t in "${targets[@]}"; do
	pkg=${t% *} fn=${t#* }
	i=$((i + 1))
	log=$logdir/$i.log
	echo "== [$i/${#targets[@]}] $pkg $fn"
	run_one "$pkg" "$fn" "$log"
	note=""
	if deadline_race "$log"; then
		echo "fuzz.sh: $fn hit Go's -fuzztime deadline race (go.dev/issue/75804), no crasher; running it again"
		run_one "$pkg" "$fn" "$log"
		note=" (rerun after go#75804)"
	fi
	if [[ $rc -eq 0 ]]; then
		status="ok$note"
	elif [[ -n $input ]]; then
		status="CRASHER input=$pkg/$input"
	elif [[ $rc -eq 124 || $rc -eq 137 ]]; then
		status="TIMEOUT after ${took}s"
	elif deadline_race "$log"; then
		status="ok (go#75804 deadline race twice, no crasher)"
	else
		status="FAILED rc=$rc (build error or failing seed; see output above)"
	fi
	[[ $status == ok* ]] || failed=$((failed + 1))
	summary+=("$(printf '%-40s %-28s execs=%-9s %4ss  %s' "$pkg" "$fn" "$execs" "$took" "$status")")
done

echo
echo "== fuzz summary ($fuzztime per target)"
printf '%s\n' "${summary[@]}"
if [[ $failed -gt 0 ]]; then
	echo "fuzz.sh: $failed of ${#targets[@]} targets failed" >&2
	exit 1
fi
