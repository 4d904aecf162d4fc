#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job: the multilingual MoE language model
# (examples/moe_lm) on 4 ranks, a 2x2 data x expert mesh, at most 10 minutes (--time-limit stops
# training early on a slow machine). Extra arguments go to moe_lm (--help lists them).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install-deps.sh demo
source scripts/mpi-env.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target moe_lm
# moe_lm's defaults are the README run: --mesh 2x2 --out moe_lm_out, --time-limit 560 and the
# step count fitted to it (--steps 0).
mpirun --oversubscribe --bind-to none --timeout 660 -n 4 build/release/examples/moe_lm/moe_lm "$@"
