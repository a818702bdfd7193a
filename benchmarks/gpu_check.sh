#!/usr/bin/env bash
# The GPU checks of one device call (issue 21: replica speed >= 8x on a GPU, the
# kernels table on a GPU; the GPU path's tests). Run from the repository root on a
# machine with a CUDA jax and the project's other dependencies, with:
#   .whl/     wheels of what that machine lacks (dp-accounting, dm-tree, tensorboardX)
#   .fmnist/  the Fashion-MNIST IDX files (FEDJAX_DP_DATA)
# Every step has its own time limit and writes under $OUT (default /tmp/gpu_out), so
# a slow step costs only its own figures. QUICK=1 runs a few-second version of each
# step (to check this script on a CPU machine before spending device time).
. benchmarks/gpu_env.sh
# the console script the CLI tests call, beside this Python
EXE=$($PY -c 'import sys; print(sys.executable)')
SCRIPT=$(dirname "$EXE")/fedjax-dp
[ -e "$SCRIPT" ] || printf '#!/bin/sh\nexec %s -m fedjax_dp "$@"\n' "$EXE" > "$SCRIPT"
chmod +x "$SCRIPT"

Q=${QUICK:-0}

if [ "$Q" = 1 ]; then
  step sweep 120 $PY benchmarks/sweep.py --seeds 2 --repeats 1 --arms cli_runs,sweep \
    --fmnist --fmnist-replicas 2 --fmnist-rounds 1 --json "$O/sweep.json"
  step kernels 120 $PY benchmarks/kernels.py --sizes small --repeats 1 --json "$O/kernels.json"
  step tests 200 env JAX_PLATFORMS= XLA_FLAGS= $PY -m pytest -q -x -p no:cacheprovider \
    tests/test_fedavg_reference.py
  exit 0
fi
# 1. replica speed: 16 seeds of the demo as one sweep (replica_batch auto = 32 on a
# GPU: one vmapped program) against 16 CLI runs; the FMNIST protocol, 16 replicas
step sweep 280 $PY benchmarks/sweep.py --seeds 16 --repeats 1 --arms sweep,cli_runs \
  --fmnist --fmnist-replicas 16 --fmnist-rounds 5 --json "$O/sweep.json"
# 2. every kernel against its numpy reference, three sizes
step kernels 110 $PY benchmarks/kernels.py --repeats 5 --json "$O/kernels.json"
# 3. the tests that check numbers of the round, the executor and the sweep, on the GPU
step tests 150 env JAX_PLATFORMS=cuda XLA_FLAGS= $PY -m pytest -q -n 6 -p no:cacheprovider \
  -o addopts="" -m "not slow" tests/test_executor.py tests/test_fedavg_reference.py \
  tests/test_central_dp.py tests/test_clipping.py tests/test_robust_aggregation.py \
  tests/test_one_step.py tests/test_sweep.py tests/test_mechanisms.py tests/test_golden.py
