#!/usr/bin/env bash
# Installs what is missing, builds gshard, and runs the whole test suite (1, 2, 4 and 8 ranks).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install-deps.sh test
jobs=$(nproc)
cmake --preset release
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs"
