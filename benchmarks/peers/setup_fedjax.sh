#!/bin/sh
# Builds benchmarks/peers/.venv-fedjax (git-ignored) for benchmarks/peers/fedjax_cross_device.py.
#
# fedjax 0.0.17 (2023, the last release) declares unpinned jax/jaxlib/dm-haiku/optax, so pip
# resolves today's. We pin the versions it resolved on 2026-11-24 and that the script ran with:
# jax/jaxlib 0.10.2 is also the JAX in the project's own .venv, so the comparison with
# benchmarks/cross_device.py is on the same XLA. fedjax needs only one shim on this JAX
# (jax.tree_map = jax.tree.map, applied in the script before importing fedjax).
#
#   sh benchmarks/peers/setup_fedjax.sh [PYTHON]      # PYTHON defaults to python3 (3.11 used)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
venv="$here/.venv-fedjax"
"${1:-python3}" -m venv "$venv"
"$venv/bin/pip" install --upgrade pip
"$venv/bin/pip" install fedjax==0.0.17 dm-haiku==0.0.17 jax==0.10.2 jaxlib==0.10.2 \
  optax==0.2.8 numpy==2.4.6
"$venv/bin/python" -c "import jax; jax.tree_map = jax.tree.map; import fedjax, haiku; \
from fedjax.algorithms import fed_avg; print('fedjax venv ok, jax', jax.__version__)"
