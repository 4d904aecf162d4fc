#!/usr/bin/env bash
# The MoE layer, forward + backward, side by side: gshard (bench_moe on 1 and 2 ranks) against
# PyTorch dense and index-based (1 and 2 threads) and JAX GSPMD (1 and 2 host devices), on the
# same shapes, each after a warm-up, medians. Regenerates the moe-table block and
# docs/moe_throughput.png (bench/moe_table.py).
#
#   bench/run_moe.sh                 # every case, 5 repetitions
#   bench/run_moe.sh --reps 3 --only gshard_4096
#
# Arguments go to every program. PyTorch is Debian's python3-torch; JAX comes from PyPI into
# build/bench-venv (created here, with the system's packages visible).
# Timings are only meaningful on an otherwise idle machine: the load average is recorded.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/install-deps.sh bench
# shellcheck source=../scripts/mpi-env.sh
source scripts/mpi-env.sh

venv=build/bench-venv
if ! "$venv/bin/python" -c "import jax, torch" 2>/dev/null; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  # numpy < 2 (and an ml_dtypes for it): Debian's torch and matplotlib were built against numpy 1.
  "$venv/bin/pip" install -q "jax[cpu]==0.4.30" "numpy<2" "ml_dtypes<0.5"
fi
py="$venv/bin/python"

cmake --preset release >/dev/null
cmake --build build/release -j2 --target bench_moe

out=build/release/bench
meta="$out/bench_moe.meta"
cpu="$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//' || true)"
{
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), ${cpu:-unknown CPU}, $(nproc) core(s)," \
    "$(mpirun --version 2>/dev/null | head -1), $("$py" -c 'import torch, jax; print("torch", torch.__version__, "jax", jax.__version__)'), args: $*"
  echo "load average before the run $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$meta"
csvs=()
for n in 1 2; do
  mpirun --oversubscribe --bind-to none -n "$n" "$out/bench_moe" --csv "$out/bench_moe.np$n.csv" "$@"
  csvs+=("$out/bench_moe.np$n.csv")
  for system in torch_dense torch_index; do
    # Its GEMMs go through Debian's BLAS (OpenBLAS here): n threads there too.
    OMP_NUM_THREADS=$n OPENBLAS_NUM_THREADS=$n taskset -c "0-$((n - 1))" \
      "$py" bench/moe_peers.py --system $system --threads "$n" \
      --csv "$out/moe_$system.$n.csv" "$@"
    csvs+=("$out/moe_$system.$n.csv")
  done
  # n host devices on n cores, as n ranks. XLA's CPU client starts threads of its own whatever
  # the flags (1 device used both cores here), so the cores are pinned with taskset.
  XLA_FLAGS="--xla_force_host_platform_device_count=$n --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \
    taskset -c "0-$((n - 1))" "$py" bench/moe_peers.py --system jax_gspmd --devices "$n" --csv "$out/moe_jax_gspmd.$n.csv" "$@"
  csvs+=("$out/moe_jax_gspmd.$n.csv")
done
# Weak scaling: 2 experts per rank, 1 to 16 ranks (oversubscribed beyond 2).
for n in 1 2 4 8 16; do
  mpirun --oversubscribe --bind-to none -n "$n" "$out/bench_moe" "$@" --only weak \
    --csv "$out/bench_moe.weak.np$n.csv"
  csvs+=("$out/bench_moe.weak.np$n.csv")
done
"$py" bench/moe_table.py --doc docs/performance.md --png docs/moe_throughput.png --meta "$meta" "${csvs[@]}"
