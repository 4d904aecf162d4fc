#!/usr/bin/env bash
# Builds bench_heat2d (release preset), runs it on 1, 2 and 4 ranks, and regenerates the heat2d
# table in docs/performance.md from the CSVs.
#
#   bench/run_heat2d.sh                       # RANKS="1 2 4", grids 1024, 2048, 4096, 5 reps
#   RANKS=2 bench/run_heat2d.sh --sizes 1024 --reps 3
#
# Arguments go to bench_heat2d. Timings are only meaningful on an otherwise idle machine: the load
# average before each run is recorded in the table.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=../scripts/mpi-env.sh
source scripts/mpi-env.sh

cmake --preset release >/dev/null
cmake --build build/release -j2 --target bench_heat2d

out=build/release/bench
meta="$out/bench_heat2d.meta"
cpu="$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//' || true)"
mpi="$(mpirun --version 2>/dev/null | head -1 || true)"
# KOKKOS_VERSION (e.g. 30401) from the configuration header of the Kokkos the build found.
config="$(echo '#include <Kokkos_Core.hpp>' | g++ -std=c++20 -H -E -x c++ - -I/usr/include/trilinos \
  2>&1 >/dev/null | grep -m1 -o '[^ ]*KokkosCore_config.h' || true)"
kokkos="$(grep -m1 -o 'define KOKKOS_VERSION [0-9]*' "$config" 2>/dev/null | grep -o '[0-9]*$' || true)"
{
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), ${cpu:-unknown CPU}, $(nproc) core(s), $mpi," \
    "g++ $(g++ -dumpfullversion), Kokkos ${kokkos:-?} (Serial), bench_heat2d $*"
} >"$meta"
csvs=()
for n in ${RANKS:-1 2 4}; do
  csv="$out/bench_heat2d.np$n.csv"
  echo "np$n: load average before the run $(cut -d' ' -f1-3 /proc/loadavg)" >>"$meta"
  mpirun --oversubscribe --bind-to none -n "$n" "$out/bench_heat2d" --csv "$csv" "$@"
  csvs+=("$csv")
done
python3 bench/heat2d_table.py --doc docs/performance.md --meta "$meta" "${csvs[@]}"
