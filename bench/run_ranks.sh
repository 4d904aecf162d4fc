#!/usr/bin/env bash
# The part the per-rank benchmark scripts share (run_heat2d.sh, run_matmul.sh): builds
# bench_<name> (release preset, or BUILD_DIR), records the machine, versions and the load average
# before each run, runs it on each rank count of RANKS (default "1 2 4"), and regenerates its
# table in DOC (default docs/performance.md) with bench/<name>_table.py.
#
#   bench/run_ranks.sh <name> "<extra versions for the record>" [arguments to bench_<name>...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=../scripts/mpi-env.sh
source scripts/mpi-env.sh

name="$1"
extra="$2"
shift 2
build="${BUILD_DIR:-build/release}"
doc="${DOC:-docs/performance.md}"
cmake --preset release -B "$build" >/dev/null
cmake --build "$build" -j2 --target "bench_$name"

out="$build/bench"
meta="$out/bench_$name.meta"
cpu="$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//' || true)"
mpi="$(mpirun --version 2>/dev/null | head -1 || true)"
# KOKKOS_VERSION (e.g. 30401) from the configuration header of the Kokkos the build found.
config="$(echo '#include <Kokkos_Core.hpp>' | g++ -std=c++20 -H -E -x c++ - -I/usr/include/trilinos \
  2>&1 >/dev/null | grep -m1 -o '[^ ]*KokkosCore_config.h' || true)"
kokkos="$(grep -m1 -o 'define KOKKOS_VERSION [0-9]*' "$config" 2>/dev/null | grep -o '[0-9]*$' || true)"
{
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), ${cpu:-unknown CPU}, $(nproc) core(s), $mpi," \
    "g++ $(g++ -dumpfullversion), Kokkos ${kokkos:-?} (Serial),${extra:+ $extra,} bench_$name $*"
} >"$meta"
csvs=()
for n in ${RANKS:-1 2 4}; do
  csv="$out/bench_$name.np$n.csv"
  echo "np$n: load average before the run $(cut -d' ' -f1-3 /proc/loadavg)" >>"$meta"
  mpirun --oversubscribe --bind-to none -n "$n" "$out/bench_$name" --csv "$csv" "$@"
  csvs+=("$csv")
done
python3 "bench/${name}_table.py" --doc "$doc" --meta "$meta" "${csvs[@]}"
