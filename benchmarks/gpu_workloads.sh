#!/usr/bin/env bash
# Issue 44's GPU figures in one device call (about 9 minutes): the card's fp32 and
# TF32 matmul rates; the peers' own protocols on our side (pfl-research's CIFAR-10
# benchmark and the FEMNIST-shaped protocol, generated data of their shapes: CIFAR-10
# cannot be carried to the machine); FedJAX on the same protocols where its wheels are
# carried in (.whl-fedjax/: fedjax and the dependencies the image lacks; pfl-research's
# CUDA torch is too big to carry, so it has no GPU figure from here); the Fashion-MNIST
# accuracy rows (the CNN centralised and FedAvg, and the ResNet-18 check). Run from the
# repository root with:
#   .whl/     wheels of what the machine lacks (dp-accounting, dm-tree, tensorboardX)
#   .fmnist/  the Fashion-MNIST IDX files (FEDJAX_DP_DATA)
# Each step has its own time limit and writes under $OUT (default /tmp/gpu_out).
# QUICK=1 runs a minutes-long version of each step (this script's check on a CPU).
TAIL=24
. benchmarks/gpu_env.sh

fedjax_venv() {   # peer_protocols.py runs FedJAX from benchmarks/peers/.venv-fedjax
  ls .whl-fedjax/*.whl >/dev/null 2>&1 || return 1
  local v=benchmarks/peers/.venv-fedjax
  $PY -m venv --system-site-packages "$v" && \
    "$v/bin/pip" install -q --no-index --no-deps --no-compile .whl-fedjax/*.whl
}

if [ "${QUICK:-0}" = 1 ]; then
  step peak 60 $PY benchmarks/peak.py
  step peers 300 $PY benchmarks/peer_protocols.py --quick --peers --json "$O/peers.json"
  step accuracy 120 $PY benchmarks/accuracy.py --rows fmnist_linear --json "$O/accuracy.json"
  exit 0
fi
step peak 60 $PY benchmarks/peak.py
step peers 170 $PY benchmarks/peer_protocols.py --protocols cifar10 femnist --rounds 30 5 \
  --peers --json "$O/peers.json"
if fedjax_venv; then
  step fedjax 150 $PY benchmarks/peer_protocols.py --protocols cifar10 femnist --rounds 10 3 \
    --peers fedjax --json "$O/peers_fedjax.json"
else
  echo "=== fedjax skipped: no .whl-fedjax/ (pip download --no-deps --only-binary=:all: \
--python-version 3.12 --platform manylinux2014_x86_64 -d .whl-fedjax fedjax==0.0.17 \
dm-haiku==0.0.17 jmp ...)"
fi
step accuracy 180 $PY benchmarks/accuracy.py --rows fmnist_cnn_central,fmnist_cnn_fedavg,fmnist_resnet18_check \
  --json "$O/accuracy.json"
