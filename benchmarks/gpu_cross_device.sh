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
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
O=${OUT:-/tmp/gpu_out}; mkdir -p "$O"
PY=${PY:-python3}
if [ "${NO_WHEELS:-0}" != 1 ] && [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export FEDJAX_DP_DATA=$PWD/.fmnist
[ -e fedjax_dp/kernels ] || ln -s ../kernels fedjax_dp/kernels
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
  $PY -c "import jax, jaxlib; print('jax', jax.__version__, jax.default_backend(), jax.devices())"
  nproc; } | tee "$O/machine.txt"

step() {   # step NAME SECONDS COMMAND...: its output in $O/NAME.log, its tail printed
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit} s) $(date +%T)"
  local t=$SECONDS
  timeout "$limit" "$@" > "$O/$name.log" 2>&1
  echo "=== $name rc=$? in $((SECONDS - t)) s"
  tail -n 16 "$O/$name.log"
}

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
