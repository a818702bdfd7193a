#!/bin/sh
# Builds benchmarks/peers/.venv-pfl (git-ignored) for benchmarks/peers/pfl_scaling.py.
#
# pfl 0.6.0 with its PyTorch backend. torch is pinned to 2.13.0 because this machine
# keeps that CPU build on disk (an unpinned torch pulls a multi-GB CUDA build), and
# pfl needs dp-accounting < 0.6, which is why it has a venv of its own. Versions as
# resolved and run on 2026-11-25.
#
#   sh benchmarks/peers/setup_pfl.sh [PYTHON]      # PYTHON defaults to python3 (3.11 used)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
venv="$here/.venv-pfl"
"${1:-python3}" -m venv "$venv"
"$venv/bin/pip" install --upgrade pip
"$venv/bin/pip" install torch==2.13.0 'pfl[pytorch]==0.6.0' 'dp-accounting<0.6' numpy==2.4.6
"$venv/bin/python" -c "import pfl, torch; from pfl.algorithm import FederatedAveraging; \
print('pfl venv ok, torch', torch.__version__)"
