#!/usr/bin/env bash
# Builds bench_reshard (release preset), runs it on 2 and 4 ranks, and regenerates the reshard
# table in docs/performance.md from the CSVs.
#
#   bench/run_reshard.sh                 # RANKS="2 4", every payload, 30 repetitions
#   RANKS=4 bench/run_reshard.sh --reps 50 --sizes 1,4
#
# Arguments go to bench_reshard. The CSVs stay in build/release/bench/ (bench_reshard.npN.csv).
# Timings are only meaningful on an otherwise idle machine: the load average before each run is
# recorded in the table.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=../scripts/mpi-env.sh
source scripts/mpi-env.sh

cmake --preset release >/dev/null
cmake --build build/release -j2 --target bench_reshard

out=build/release/bench
meta="$out/bench_reshard.meta"
cpu="$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//' || true)"
mpi="$(mpirun --version 2>/dev/null | head -1 || true)"
{
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), ${cpu:-unknown CPU}, $(nproc) core(s), $mpi," \
    "bench_reshard $*"
} >"$meta"
csvs=()
for n in ${RANKS:-2 4}; do
  csv="$out/bench_reshard.np$n.csv"
  echo "np$n: load average before the run $(cut -d' ' -f1-3 /proc/loadavg)" >>"$meta"
  mpirun --oversubscribe --bind-to none -n "$n" "$out/bench_reshard" --csv "$csv" "$@"
  csvs+=("$csv")
done
python3 bench/reshard_table.py --doc docs/performance.md --meta "$meta" "${csvs[@]}"
