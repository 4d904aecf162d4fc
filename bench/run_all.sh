#!/usr/bin/env bash
# Every benchmark, one after the other, each regenerating its block of docs/performance.md:
# the local einsum against Eigen/OpenBLAS, resharding against raw MPI, the MoE layer against
# PyTorch and JAX (with weak scaling 1..16 ranks), the heat2d stencil against hand-written MPI, the
# distributed GEMM against ScaLAPACK, the network's cost on the multi-host test bed (root only),
# and compile times. About an hour on 2 cores.
# Run it on an otherwise idle machine: the load average is recorded with each table.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash bench/run_einsum.sh
bash bench/run_reshard.sh
bash bench/run_moe.sh
bash bench/run_moe_lm_step.sh
bash bench/run_heat2d.sh
bash bench/run_matmul.sh --shapes square,tall --reps 2
bash bench/run_network.sh || [ $? -eq 77 ]  # 77: no test bed here (not root)
cmake --build build/release -j2  # every target, so the compile commands below have their PCHs
python3 bench/compile_times.py --build build/release --doc docs/performance.md \
  --csv build/release/bench/compile_times.csv
