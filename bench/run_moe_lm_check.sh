#!/usr/bin/env bash
# The main job's training step against PyTorch from a trained state (bench/moe_lm_check_step.py):
# trains the README run's model (2x2 mesh, 4 ranks) for STEPS + 1 steps in one process, with
# checkpoints after steps STEPS and STEPS + 1, and has the PyTorch peer redo the last step from the
# first checkpoint; the held-out and step losses, every parameter's gradient and every update must
# agree to float rounding. RESUME=1 resumes for the last step instead (a fresh process).
#
#   bench/run_moe_lm_check.sh                  # 600 steps (about 4 minutes on 2 cores)
#   STEPS=100 MESH=1x2 bench/run_moe_lm_check.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=../scripts/mpi-env.sh
source scripts/mpi-env.sh
bash bench/torch_venv.sh
cmake --preset release >/dev/null
cmake --build build/release -j2 --target moe_lm

steps=${STEPS:-600}
[ "$steps" -ge 1 ] || { echo "run_moe_lm_check: STEPS must be at least 1" >&2; exit 2; }
mesh=${MESH:-2x2}
ranks=$(($(echo "$mesh" | tr 'x' '*')))
dir=build/release/bench/moe_lm_check
rm -rf "$dir"
run() {
  mpirun --oversubscribe --bind-to none -n "$ranks" build/release/examples/moe_lm/moe_lm \
    --mesh "$mesh" --time-limit 0 --sample-bytes 0 --checkpoint-dir "$dir/checkpoints" \
    --out "$dir/out" "$@" | grep -E '^(resumed|done)'
}
if [ "${RESUME:-0}" = 1 ]; then
  run --steps "$steps"
  run --steps "$((steps + 1))"
else
  # Checkpoints at each evaluation and after the last step; the newest two are kept.
  run --steps "$((steps + 1))" --eval-every "$steps"
fi
printf -v a '%s/checkpoints/step_%08d.safetensors' "$dir" "$steps"
printf -v b '%s/checkpoints/step_%08d.safetensors' "$dir" "$((steps + 1))"
build/torch-venv/bin/python bench/moe_lm_check_step.py "$a" "$b"
