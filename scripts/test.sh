#!/usr/bin/env bash
# Installs what is missing, builds gshard, and runs the whole test suite (1, 2, 4 and 8 ranks)
# under AddressSanitizer and UBSan (the asan preset: -O0, so the build stays short).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install-deps.sh test
jobs=$(nproc)
cmake --preset asan
cmake --build --preset asan -j "$jobs"
ctest --preset asan -j "$jobs"
