#!/usr/bin/env bash
# Issue 44's GPU figures in one device call (about 8 minutes): the card's fp32 and
# TF32 matmul rates; the peers' own protocols on our side (pfl-research's CIFAR-10
# benchmark and the FEMNIST-shaped protocol, generated data of their shapes: CIFAR-10
# cannot be carried to the machine); FedJAX on the same protocols where its wheels are
# carried in (.whl-fedjax/: fedjax and the dependencies the image lacks; pfl-research's
# CUDA torch is too big to carry, so it has no GPU figure from here); the Fashion-MNIST
# accuracy rows (the CNN centralised and FedAvg, and the ResNet-18 check). Run from the
# repository root with:
#   .whl/     wheels of what the machine lacks (dp-accounting, dm-tree, tensorboardX)
#   .fmnist/  the Fashion-MNIST IDX files (FEDJAX_DP_DATA)
# Each step has its own time limit; logs go to $OUT (default /tmp/gpu_out), results to
# a new folder $OUT/workloads-<date-time> (a second call never meets the first's files).
# Exits 1 if a step failed. QUICK=1 runs a minute-long version (this script's check on
# a CPU).
TAIL=24
. benchmarks/gpu_env.sh
R="$O/workloads-$(date +%Y%m%d-%H%M%S)"; mkdir -p "$R"

# peer_protocols.py runs FedJAX as benchmarks/peers/.venv-fedjax/bin/python: here a
# wrapper of $PY with the carried wheels on its path (a venv of a venv's Python would
# not see that venv's jax)
fedjax_python() {
  local bin=benchmarks/peers/.venv-fedjax/bin
  [ -x "$bin/python" ] && return 0   # its own venv (setup_fedjax.sh): kept
  if ! ls .whl-fedjax/*.whl >/dev/null 2>&1; then
    echo "=== fedjax skipped: no .whl-fedjax/ (pip download --no-deps --only-binary=:all: \
--python-version 3.12 --platform manylinux2014_x86_64 -d .whl-fedjax fedjax==0.0.17 \
dm-haiku==0.0.17 jmp tabulate requests urllib3 idna certifi charset-normalizer: the set \
checked to import on this JAX)"; return 1
  fi
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-fedjax \
    .whl-fedjax/*.whl || { echo "=== fedjax skipped: its wheels did not install"; return 1; }
  mkdir -p "$bin" && printf '#!/bin/sh\nPYTHONPATH=/tmp/site-fedjax:%s exec %s "$@"\n' \
    "$PYTHONPATH" "$(command -v "$PY")" > "$bin/python" && chmod +x "$bin/python"
}

if [ "${QUICK:-0}" = 1 ]; then
  step peak 60 $PY benchmarks/peak.py
  step peers 300 $PY benchmarks/peer_protocols.py --quick --peers --json "$R/peers.json"
  step accuracy 120 $PY benchmarks/accuracy.py --rows fmnist_linear --json "$R/accuracy.json"
  exit $((FAILED > 0))
fi
step peak 45 $PY benchmarks/peak.py
step peers 150 $PY benchmarks/peer_protocols.py --protocols cifar10 femnist --rounds 30 5 \
  --peers --json "$R/peers.json"
if fedjax_python; then
  step fedjax 130 $PY benchmarks/peer_protocols.py --protocols cifar10 femnist --rounds 10 3 \
    --peers fedjax --json "$R/peers_fedjax.json"
fi
step accuracy 150 $PY benchmarks/accuracy.py \
  --rows fmnist_cnn_central,fmnist_cnn_fedavg,fmnist_resnet18_check --json "$R/accuracy.json"
exit $((FAILED > 0))
