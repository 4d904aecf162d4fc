#!/usr/bin/env bash
# The main job's training step, gshard against PyTorch eager (and torch.compile) on the same model,
# shapes and core count: bench_moe_lm_step on 1 and 2 ranks (mesh 1x1, 1x2) and on 4 ranks
# oversubscribed (2x2, the README run) beside bench/moe_lm_peer.py on 1 and 2 threads; the step
# plan of gshard's step on 1 and 2 ranks (ops by self time). Regenerates the moe-lm-step block of
# docs/performance.md (bench/moe_lm_step_table.py).
#
#   bench/run_moe_lm_step.sh                 # 20 steps each after 3 warm-up steps
#   STEPS=10 bench/run_moe_lm_step.sh
#
# PyTorch comes from PyPI into build/torch-venv (bench/torch_venv.sh; about 5 GB). Timings are
# only meaningful on an otherwise idle machine: vmstat's idle share before each run is recorded.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=../scripts/mpi-env.sh
source scripts/mpi-env.sh
bash bench/torch_venv.sh
py=build/torch-venv/bin/python

cmake --preset release >/dev/null
cmake --build build/release -j2 --target bench_moe_lm_step

out=build/release/bench
steps=${STEPS:-20}
meta="$out/bench_moe_lm_step.meta"
cpu="$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//' || true)"
{
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), ${cpu:-unknown CPU}, $(nproc) core(s)," \
    "$(mpirun --version 2>/dev/null | head -1), torch $("$py" -c 'import torch; print(torch.__version__)')," \
    "median of $steps steps after 3 warm-up steps"
} >"$meta"
idle() { vmstat 1 2 | tail -1 | awk '{print $15}'; }
csvs=()
for n in 1 2; do
  echo "$n core(s): CPU idle before the runs $(idle)%" >>"$meta"
  mpirun --oversubscribe --bind-to none -n "$n" "$out/bench_moe_lm_step" --mesh "1x$n" \
    --steps "$steps" --warmup 3 --csv "$out/moe_lm_step.gshard.$n.csv" --profile 3 \
    --plan-json "$out/moe_lm_step.plan.$n.json"
  csvs+=("$out/moe_lm_step.gshard.$n.csv")
  for mode in eager compile; do
    flag=()
    [ "$mode" = compile ] && flag=(--compile)
    # PyTorch's threads on the same cores as the ranks.
    OMP_NUM_THREADS=$n MKL_NUM_THREADS=$n taskset -c "0-$((n - 1))" "$py" bench/moe_lm_peer.py \
      --threads "$n" --steps "$steps" --warmup 3 "${flag[@]}" --csv "$out/moe_lm_step.torch_$mode.$n.csv"
    csvs+=("$out/moe_lm_step.torch_$mode.$n.csv")
  done
done
# The README run's mesh: 4 ranks on the 2 cores.
mpirun --oversubscribe --bind-to none -n 4 "$out/bench_moe_lm_step" --mesh 2x2 --steps "$steps" \
  --warmup 3 --csv "$out/moe_lm_step.gshard.4.csv"
csvs+=("$out/moe_lm_step.gshard.4.csv")
python3 bench/moe_lm_step_table.py --doc docs/performance.md --meta "$meta" \
  --plan "$out/moe_lm_step.plan.1.json" --plan "$out/moe_lm_step.plan.2.json" "${csvs[@]}"
