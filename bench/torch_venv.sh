#!/usr/bin/env bash
# PyTorch from PyPI for bench/moe_lm_peer.py, in build/torch-venv (Debian 12's Python 3.11);
# nothing to do when it is already there.
#
#   bench/torch_venv.sh && build/torch-venv/bin/python bench/moe_lm_peer.py --steps 20
#
# The Linux wheel is linked against NVIDIA's CUDA libraries even for CPU use: with --no-deps the
# import fails (libcufile.so.0 missing), so the install takes its dependencies, about 5 GB of
# mostly unused CUDA packages. numpy: moe_lm_peer.py rebuilds gshard's random draws with it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/build/torch-venv"
version="${TORCH_VERSION:-2.15.0}"

check() {
  "$venv/bin/python" - "$version" <<'EOF'
import sys
import torch
assert torch.__version__.split("+")[0] == sys.argv[1], torch.__version__
assert (torch.ones(2, 2) @ torch.ones(2, 2)).sum().item() == 8
EOF
}

if [[ -x "$venv/bin/python" ]] && check 2>/dev/null; then
  echo "torch_venv: $venv has torch $version"
  exit 0
fi
/usr/bin/python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q "torch==$version" numpy
check
echo "torch_venv: installed torch $version in $venv"
