#!/usr/bin/env bash
# Builds bench_heat2d (release preset), runs it on 1, 2 and 4 ranks, and regenerates the heat2d
# table in docs/performance.md from the CSVs (bench/run_ranks.sh).
#
#   bench/run_heat2d.sh                       # RANKS="1 2 4", grids 1024, 2048, 4096, 5 reps
#   RANKS=2 bench/run_heat2d.sh --sizes 1024 --reps 3
#
# Arguments go to bench_heat2d. Timings are only meaningful on an otherwise idle machine: the load
# average before each run is recorded in the table.
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/run_ranks.sh" heat2d "" "$@"
