#!/usr/bin/env bash
# Builds bench_einsum (release preset), runs it on one rank with one thread, and regenerates the
# einsum table in docs/performance.md from its CSV.
#
#   bench/run_einsum.sh                  # every shape: 1 warm-up, then >= 7 repetitions and >= 3 s
#   bench/run_einsum.sh --reps 11 --min-seconds 5 --only moe
#
# Arguments go to bench_einsum. The CSV stays in build/release/bench/bench_einsum.csv.
# scripts/mpi-env.sh sets OPENBLAS_NUM_THREADS=1: Eigen runs one thread here, so OpenBLAS (both
# directly and inside gshard) must too for a like-for-like comparison.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=../scripts/mpi-env.sh
source scripts/mpi-env.sh

cmake --preset release >/dev/null
cmake --build build/release -j2 --target bench_einsum

out=build/release/bench
csv="$out/bench_einsum.csv"
meta="$out/bench_einsum.meta"
cpu="$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//' || true)"
{
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), ${cpu:-unknown CPU}, $(nproc) core(s), 1 rank," \
    "OPENBLAS_NUM_THREADS=$OPENBLAS_NUM_THREADS, bench_einsum $*"
  echo "load average before the run $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$meta"
mpirun -n 1 "$out/bench_einsum" --csv "$csv" "$@"
python3 bench/einsum_table.py --doc docs/performance.md --meta "$meta" "$csv"
