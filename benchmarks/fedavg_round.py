"""Core benchmark: FedAvg rounds on full Fashion-MNIST against a PyTorch per-client loop.

Protocol (issue 2): 100 clients, Dirichlet(alpha=0.5) label skew, all 100
clients every round, E = 1, batch 64, MLP 784-200-200-10, SGD lr 0.01
momentum 0.5. In one invocation it measures
  * seconds per round of fedjax-dp (median of >= 5 rounds after compilation),
  * achieved GFLOP/s = 6 * params * examples per round / seconds, against
    this machine's fp32 matmul peak measured in the same run,
  * the same rounds as a plain PyTorch per-client loop on the same partition,
  * optionally (--accuracy-rounds N) test accuracy after N rounds.

  python benchmarks/fedavg_round.py [--rounds 7] [--torch-rounds 6] [--accuracy-rounds 200] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fedjax_dp.placement.host import use_cpu_devices_or_exit

use_cpu_devices_or_exit()  # as the CLI does: one XLA CPU device per core

import jax

from cli_args import new_file, write_results, nonnegative_int, positive_int
from fedjax_dp import make_config
from fedjax_dp.models import num_params
from fedjax_dp.experiment.setup import setup
from fedjax_dp.core.evaluate import batch_for_eval

PROTOCOL = dict(dataset="fmnist", num_clients=100, clients_per_round=100, partition="dirichlet",
                alpha=0.5, model="mlp", hidden=[200, 200], local_epochs=1, batch_size=64, lr=0.01,
                momentum=0.5, sampling="fixed", seed=0)


def time_rounds(sim, rounds: int):
  """(state, compile seconds, [seconds of each of `rounds` rounds]): the first
  round (compilation included) and then each round timed to block_until_ready.
  Shared by the benchmarks that time a Simulation (cross_device.py, scaling.py)."""
  state = sim.init_state()
  t = time.perf_counter()
  state, _ = sim.run_rounds(state, 1)
  jax.block_until_ready(state)
  compile_s = time.perf_counter() - t
  times = []
  for _ in range(rounds):
    t = time.perf_counter()
    state, _ = sim.run_rounds(state, 1)
    jax.block_until_ready(state)
    times.append(time.perf_counter() - t)
  return state, compile_s, times


def time_fedjax(cfg, rounds: int):
  ds, parts, sim = setup(cfg)  # same seed: the same data split and partition as the torch loop
  state, compile_s, times = time_rounds(sim, rounds)
  return ds, parts, sim, state, compile_s, times


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--rounds", type=positive_int, default=7, help="timed fedjax-dp rounds after compilation")
  ap.add_argument("--torch-rounds", type=positive_int, default=6, help="PyTorch loop rounds (first is warm-up)")
  ap.add_argument("--accuracy-rounds", type=nonnegative_int, default=0, help="also train N rounds and report accuracy")
  ap.add_argument("--parallelism", default="auto", choices=["auto", "map", "vmap"])
  ap.add_argument("--client-batch", type=positive_int, default=1)
  ap.add_argument("--devices", type=nonnegative_int, default=0, help="mesh size (0 = all devices)")
  ap.add_argument("--data-dir", default=None)
  ap.add_argument("--json", default=None, type=new_file,
                  help="write the results here too (refuses an existing file)")
  args = ap.parse_args(argv)

  from peak import measure_matmul_peak
  from fedjax_dp.experiment.setup import client_partition, load_data
  cfg = make_config(dict(PROTOCOL, data_dir=args.data_dir, client_parallelism=args.parallelism,
                         client_batch=args.client_batch, devices=args.devices))
  # The PyTorch loop runs first, before JAX computes anything: XLA's worker
  # threads linger after a computation and would slow a loop timed after it.
  data = load_data(cfg)
  parts = client_partition(cfg, data)
  try:
    from torch_fedavg import torch_fedavg_round_times
    tr = torch_fedavg_round_times(data.x_train, data.y_train, parts, hidden=(200, 200),
                                  num_classes=data.num_classes, local_epochs=1, batch_size=64,
                                  lr=0.01, momentum=0.5, rounds=args.torch_rounds, seed=0)
    tr.pop("model")
  except ImportError as e:
    tr = f"skipped: {e} (install with `make bench` or pip install torch==2.13.0)"
  peak = measure_matmul_peak()
  ds, parts, sim, state, compile_s, times = time_fedjax(cfg, args.rounds)
  d = num_params(state.params)
  examples = sum(len(p) for p in parts) * cfg.local_epochs
  flops = 6 * d * examples
  med = statistics.median(times)
  result = {
      "protocol": PROTOCOL, "machine": platform.processor() or platform.machine(),
      "cpu_count": os.cpu_count(), "jax": jax.__version__, "params": d,
      "examples_per_round": examples,
      "client_sizes": {"min": min(map(len, parts)), "max": max(map(len, parts))},
      "client_parallelism": sim.client_parallelism, "client_batch": cfg.client_batch,
      "devices": int(sim.mesh.devices.size),
      "compile_s": round(compile_s, 2),
      "fedjax_round_s": [round(t, 4) for t in times], "fedjax_median_round_s": round(med, 4),
      "fedjax_gflops": round(flops / med / 1e9, 1),
      "matmul_peak": peak, "fraction_of_peak": round(flops / med / 1e9 / peak["peak_gflops"], 3),
      "torch": tr,
  }
  if isinstance(tr, dict):
    result["torch_gflops"] = round(flops / tr["median_round_s"] / 1e9, 1)
    result["speedup_vs_torch"] = round(tr["median_round_s"] / med, 2)
  if args.accuracy_rounds:
    eval_data = batch_for_eval(ds.x_test, ds.y_test, 1000)
    acc_state = sim.init_state()
    curve = []
    done = 0
    while done < args.accuracy_rounds:
      n = min(10, args.accuracy_rounds - done)
      acc_state, _ = sim.run_rounds(acc_state, n)
      done += n
      curve.append((done, float(sim.evaluate(acc_state.params, *eval_data)["accuracy"])))
    result["accuracy_curve"] = curve
    result["final_test_accuracy"] = curve[-1][1]
    result["first_round_reaching_80pct"] = next((r for r, a in curve if a >= 0.80), None)
  print(json.dumps(result, indent=2))
  if args.json:
    write_results(result, args.json)


if __name__ == "__main__":
  main()
