#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job on 4 ranks.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install-deps.sh demo
source scripts/mpi-env.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target sharded_matvec
mpirun --oversubscribe --bind-to none --timeout 600 -n 4 build/release/examples/sharded_matvec "$@"
