#!/usr/bin/env bash
# Installs what is missing, builds gshard, and runs the test suite on two Kokkos backends and two
# compilers (docs/backends.md):
#   1. the whole suite (1, 2, 4 and 8 ranks) under AddressSanitizer and UBSan (-O0) against a
#      Kokkos with the OpenMP backend, 2 threads per rank: Kokkos 3.4.01 built from PyPI's
#      pykokkos-base sdist by scripts/kokkos-openmp.sh, cached after the first run; then the
#      op families with row kernels again on their device path (GSHARD_ROW_TEAMS=1);
#   2. Debian's Kokkos (Serial), optimised: the tests whose code differs on Serial (scatter-adds
#      without atomics, the host execution space) and the examples, at 1, 2, 4 and 8 ranks;
#   3. clang 19: every source through its front end, and the compile-fail cases.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install-deps.sh test
jobs=$(nproc)
section() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }

section "Kokkos OpenMP"
kokkos_openmp=$(bash scripts/kokkos-openmp.sh | tail -1)

section "1. the whole suite, ASan+UBSan, Kokkos OpenMP, 2 threads per rank"
cmake --preset asan-openmp -DKokkos_ROOT="$kokkos_openmp"
cmake --build --preset asan-openmp -j "$jobs"
ctest --preset asan-openmp -j "$jobs"
# The row kernels' device path (one team per row) on OpenMP: the op families that use it.
GSHARD_ROW_TEAMS=1 ctest --preset asan-openmp -j "$jobs" \
  -R '^(ops_(reduce|normalize|index|scan|take_along|topk)_test|expr_test|autodiff_grad_(norm|index|along)_test)\.np[124]$'

section "2. Debian's Kokkos (Serial), release"
serial_tests=(ops_index_test autodiff_grad_index_test sharded_test reshard_property_test
  einsum_property_test nn_moe_test)
serial_examples=(sharded_matvec tutorial_01_sharded_matmul tutorial_02_moe_layer
  tutorial_03_training)
cmake --preset serial
cmake --build --preset serial -j "$jobs" --target "${serial_tests[@]}" "${serial_examples[@]}"
regex="^($(IFS='|'; echo "${serial_tests[*]}"))\.np[0-9]+$|^example\.(sharded_matvec|tutorial_0[1-3]_[a-z_]+)\.np[0-9]+$"
ctest --preset serial -j "$jobs" -R "$regex"

section "3. clang 19"
bash scripts/clang-check.sh build/clang
section "done"
