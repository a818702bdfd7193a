#!/usr/bin/env bash
# Issue 43's GPU figures in one device call (about 6 minutes): the card's fp32 and
# TF32 matmul rates; the core protocol (FMNIST, 100 clients); the cross-device rows
# (10,000 x 6: one step, four steps, central and local DP, each on auto and on the
# per-client loop); 1,000,000 clients with a cohort of 10,000; and FedJAX 0.0.17 on
# the same rounds where its wheels are carried in (.whl-fedjax/: fedjax and its
# dependencies the image lacks). Run from the repository root with:
#   .whl/     wheels of what the machine lacks (dp-accounting, dm-tree, tensorboardX)
#   .fmnist/  the Fashion-MNIST IDX files (FEDJAX_DP_DATA)
# Each step has its own time limit and writes under $OUT (default /tmp/gpu_out).
# QUICK=1 runs a seconds-long version of each step (this script's check on a CPU).
TAIL=16
. benchmarks/gpu_env.sh

if [ "${QUICK:-0}" = 1 ]; then
  step peak 60 $PY benchmarks/peak.py
  step core 120 $PY benchmarks/fedavg_round.py --rounds 1 --torch-rounds 2 --json "$O/core.json"
  step scaling 120 $PY benchmarks/scaling.py --clients 1000 --cohort-max 100 --rounds 1 \
    --kind stateless --peers --json "$O/scaling.json"
  exit 0
fi
step peak 60 $PY benchmarks/peak.py
step core 120 $PY benchmarks/fedavg_round.py --rounds 20 --torch-rounds 2 --json "$O/core.json"
step rows 200 $PY benchmarks/cross_device.py --rows --rounds 5 --json "$O/rows.json"
step scaling 120 $PY benchmarks/scaling.py --clients 1000000 --cohort-max 10000 --rounds 20 \
  --kind stateless --peers --json "$O/scaling.json"
if ls .whl-fedjax/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-fedjax \
    .whl-fedjax/*.whl && \
  step fedjax 150 env PYTHONPATH=/tmp/site-fedjax:$PYTHONPATH $PY \
    benchmarks/peers/fedjax_cross_device.py --clients 10000 100 --rounds 3 \
    --json "$O/fedjax.json"
else
  echo "=== fedjax skipped: no .whl-fedjax/ (pip download --no-deps --only-binary=:all: \
--python-version 3.12 --platform manylinux2014_x86_64 -d .whl-fedjax fedjax==0.0.17 ...)"
fi
