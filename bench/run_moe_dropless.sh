#!/usr/bin/env bash
# Dropless routing against the capacity path (issue 22, point 3): bench_moe's modes cf2, cf1.25,
# dropless, cf2_skew and dropless_skew on the same inputs, on 1 and 2 ranks (the gshard_T and
# tutel cases) and weak scaling on 1..16 ranks (oversubscribed beyond 2), one process per case and
# mode (so each row's peak RSS is its own). Prints the markdown table (bench/moe_dropless_table.py)
# and leaves it in $out/moe_dropless_table.md; writes no document.
#
#   bench/run_moe_dropless.sh                    # 5 repetitions after 1 warm-up
#   bench/run_moe_dropless.sh --reps 3 --warmup 1
#   GSHARD_BENCH_BUILD=build/mm bench/run_moe_dropless.sh   # an already configured build
#   CASES="gshard_4096" WEAK_RANKS="1 2" bench/run_moe_dropless.sh --reps 1   # a short check
#
# Arguments go to every bench_moe run. Timings are only meaningful on an otherwise idle machine:
# the load average is recorded. About 30 minutes on 2 idle cores.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=../scripts/mpi-env.sh
source scripts/mpi-env.sh

build="${GSHARD_BENCH_BUILD:-build/release}"
if [ -z "${GSHARD_BENCH_BUILD:-}" ]; then
  cmake --preset release >/dev/null
fi
cmake --build "$build" -j2 --target bench_moe

cases="${CASES:-gshard_4096 gshard_8192 gshard_16384 tutel}"
weak_ranks="${WEAK_RANKS:-1 2 4 8 16}"
modes="${MODES:-cf2 cf1.25 dropless cf2_skew dropless_skew}"
out="$build/bench/moe_dropless"
mkdir -p "$out"
rm -f "$out"/*.csv
meta="$out/meta"
cpu="$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//' || true)"
{
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), ${cpu:-unknown CPU}, $(nproc) core(s)," \
    "$(mpirun --version 2>/dev/null | head -1), args: $*"
  echo "load average before the run $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$meta"
run() {  # ranks case mode [args]
  local n=$1 c=$2 m=$3
  shift 3
  mpirun --oversubscribe --bind-to none -n "$n" "$build/bench/bench_moe" --only "$c" \
    --modes "$m" --csv "$out/$c.$m.np$n.csv" "$@"
}
for n in 1 2; do
  for c in $cases; do
    for m in $modes; do run "$n" "$c" "$m" "$@"; done
  done
done
for n in $weak_ranks; do
  for m in $modes; do run "$n" weak "$m" "$@"; done
done
echo "load average after the run $(cut -d' ' -f1-3 /proc/loadavg)" >>"$meta"
python3 bench/moe_dropless_table.py --meta "$meta" "$out"/*.csv | tee "$out/moe_dropless_table.md"
