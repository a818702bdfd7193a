#!/bin/sh
# Builds benchmarks/peers/.venv-flower (git-ignored) for benchmarks/peers/flower_scaling.py.
#
# Flower 1.41.0 with its simulation runtime (Ray; 1.42 needs an unreleased certifi) and
# torch 2.13.0, the CPU build this machine keeps on disk. Ray needs loopback up.
# Versions as resolved and run on 2026-11-25 (ray 2.55.1).
#
#   sh benchmarks/peers/setup_flower.sh [PYTHON]   # PYTHON defaults to python3 (3.11 used)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
venv="$here/.venv-flower"
"${1:-python3}" -m venv "$venv"
"$venv/bin/pip" install --upgrade pip
"$venv/bin/pip" install torch==2.13.0 'flwr[simulation]==1.41.0' numpy==2.4.6
"$venv/bin/python" -c "import flwr, ray, torch; from flwr.simulation import run_simulation; \
print('flower venv ok, flwr', flwr.__version__, 'ray', ray.__version__)"
