#!/usr/bin/env bash
# Builds bench_matmul (release preset), runs it on 1, 2 and 4 ranks, and regenerates the matmul
# table in docs/performance.md from the CSVs (bench/run_ranks.sh). Needs ScaLAPACK
# (libscalapack-openmpi-dev).
#
#   bench/run_matmul.sh --shapes square,tall --reps 2   # the table's run: RANKS="1 2 4"
#   RANKS=2 bench/run_matmul.sh --shapes square --scale 4 --reps 1
#   BUILD_DIR=build/mm DOC=/tmp/perf.md bench/run_matmul.sh ...   # another build, another doc
#
# Arguments go to bench_matmul. The full run holds 16k x 16k matrices (2 GiB in double) and takes
# about 15 minutes on 2 cores. Timings are only meaningful on an otherwise idle machine: the load
# average before each run is recorded in the table.
set -euo pipefail
scalapack="$(dpkg-query -W -f='${Version}' libscalapack-openmpi-dev 2>/dev/null || true)"
exec "$(dirname "${BASH_SOURCE[0]}")/run_ranks.sh" matmul \
  "ScaLAPACK ${scalapack:-?}, OpenBLAS one thread per rank (scripts/mpi-env.sh)" "$@"
