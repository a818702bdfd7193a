"""Cross-device FedAvg: many clients with few examples each, against the CPU's peak.

Protocols (issue 20): Fashion-MNIST iid over N clients, every client every
round, E = 1, batch 64, MLP 784-200-200-10, SGD lr 0.01 momentum 0.5; each
round trains on the same 60,000 examples:

  10000x6    10,000 clients x 6 examples
  1000x60     1,000 clients x 60 examples
  100x600       100 clients x 600 examples (the core protocol's sizes, iid)

For each protocol and each client path named with --parallelism (auto picks
one_step where every client takes one step, else map), one invocation
measures seconds per round (median of --rounds after compilation), GFLOP/s =
6 * params * examples / seconds, and the fraction of this machine's fp32
matmul peak measured in the same run (before and after the protocols; the
larger is the yardstick). --sgd-ceiling also times plain centralised SGD over
the same 60,000 examples in batches of 64 (no clients, no aggregation; each
device a half): the most a loop of batch-64 steps gets from this machine,
the ceiling of any protocol whose clients take many steps.

--dp central local also times each protocol under DP (clip 1.0, noise
multiplier 1.0: central DP's noise on the sum, or each client's own under
local DP); every run reports the compiled round's temporary memory (XLA's
memory analysis), which shows whether a round holds a [cohort, d] stack.

  python benchmarks/cross_device.py [--protocol 10000x6 ...] [--parallelism auto map]
      [--dp none central local] [--json OUT]

--rows (issue 43) instead times the cross-device rows at 10,000 x 6 with the
peak and this machine's memory and cache bandwidths measured in the same run:

  fedavg_one_step     E = 1, B = 64: one step a client (the yardstick)
  fedavg_many_steps   E = 2, B = 3: four steps a client
  central_dp          E = 1, B = 64, clip 1, z 1
  local_dp            E = 1, B = 64, clip 1, z 1
  central_dp_steps    E = 2, B = 3 under central DP

each on the path auto picks and on the per-client loop (map), printing the ratio
to fedavg_one_step's auto round, the useful GFLOP/s (6 params x example-steps a
second) and its share of the roofline: the most the schedule allows, useful
FLOPs over the matmul peak (each path's weights are shared or in cache), and for
the loop, whose every step reads its client's weights for B examples, at least
3 params x 4 bytes a step over the cache bandwidth.

  python benchmarks/cross_device.py --rows [--rounds 5] [--json OUT]
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

from cli_args import new_file, write_results, positive_int
from fedavg_round import time_rounds
from fedjax_dp import make_config
from fedjax_dp.experiment.setup import setup
from fedjax_dp.models import num_params

PROTOCOLS = {"10000x6": 10000, "1000x60": 1000, "100x600": 100}
BASE = dict(dataset="fmnist", partition="iid", model="mlp", hidden=[200, 200], local_epochs=1,
            batch_size=64, lr=0.01, momentum=0.5, sampling="fixed", seed=0)


DP = {"none": {}, "central": dict(dp="central", clip_norm=1.0, noise_multiplier=1.0),
      "local": dict(dp="local", clip_norm=1.0, noise_multiplier=1.0)}


def time_protocol(num_clients: int, parallelism: str, rounds: int, data_dir,
                  dp: str = "none") -> dict:
  cfg = make_config(dict(BASE, num_clients=num_clients, clients_per_round=num_clients,
                         client_parallelism=parallelism, data_dir=data_dir, **DP[dp]))
  _, parts, sim = setup(cfg)
  compiled = sim.run_chunk.lower(sim.init_state(), sim.store, sim.hparams, 1).compile()
  temp_mb = compiled.memory_analysis().temp_size_in_bytes / 2**20
  state, compile_s, times = time_rounds(sim, rounds)
  examples = sum(len(p) for p in parts)
  med = statistics.median(times)
  return {"client_parallelism": sim.client_parallelism, "dp": dp, "temp_mb": round(temp_mb, 1),
          "compile_s": round(compile_s, 2),
          "round_s": [round(x, 4) for x in times], "median_round_s": round(med, 4),
          "examples_per_round": examples,
          "client_sizes": [min(map(len, parts)), max(map(len, parts))],
          "gflops": round(6 * num_params(state.params) * examples / med / 1e9, 1)}


ROWS = {"fedavg_one_step": dict(local_epochs=1, batch_size=64),
        "fedavg_many_steps": dict(local_epochs=2, batch_size=3),
        "central_dp": dict(local_epochs=1, batch_size=64, **DP["central"]),
        "local_dp": dict(local_epochs=1, batch_size=64, **DP["local"]),
        "central_dp_steps": dict(local_epochs=2, batch_size=3, **DP["central"])}


def time_row(row: str, parallelism: str, rounds: int, data_dir) -> dict:
  """One row of --rows at 10,000 x 6 on `parallelism`."""
  cfg = make_config(dict(BASE, num_clients=10000, clients_per_round=10000,
                         client_parallelism=parallelism, data_dir=data_dir, **ROWS[row]))
  _, parts, sim = setup(cfg)
  state, compile_s, times = time_rounds(sim, rounds)
  params, examples = num_params(state.params), sum(len(p) for p in parts)
  steps = cfg.local_epochs * sum(-(-len(p) // cfg.batch_size) for p in parts)
  return {"row": row, "client_parallelism": sim.client_parallelism,
          "median_round_s": round(statistics.median(times), 4),
          "round_s": [round(x, 4) for x in times], "compile_s": round(compile_s, 2),
          "useful_gflop": round(6 * params * examples * cfg.local_epochs / 1e9, 2),
          "weight_gb_per_loop_round": round(3 * params * 4 * steps / 1e9, 2)}


def row_table(args) -> dict:
  """--rows: every row on auto and map, with the peak and bandwidths measured here."""
  from peak import measure_bandwidths, measure_matmul_peak
  peaks, bandwidths = [measure_matmul_peak()], measure_bandwidths()
  runs = [time_row(row, par, args.rounds, args.data_dir)
          for row in ROWS for par in ("auto", "map")]
  peaks.append(measure_matmul_peak())
  peak = max(p["peak_gflops"] for p in peaks)
  base = next(r for r in runs if r["row"] == "fedavg_one_step" and
              r["client_parallelism"] != "map")["median_round_s"]
  print(f"matmul peak {peak} GFLOP/s, memory {bandwidths['memory_gbps']} GB/s, cache "
        f"{bandwidths['cache_gbps']} GB/s\n| row | path | s / round | vs FedAvg one step | "
        "useful GFLOP/s | roofline s | % of roofline |\n| --- | --- | --- | --- | --- | --- | --- |")
  for r in runs:
    roofline = r["useful_gflop"] / peak
    if r["client_parallelism"] == "map":
      roofline = max(roofline, r["weight_gb_per_loop_round"] / bandwidths["cache_gbps"])
    r.update(ratio=round(r["median_round_s"] / base, 2), roofline_s=round(roofline, 3),
             gflops=round(r["useful_gflop"] / r["median_round_s"], 1),
             fraction_of_roofline=round(roofline / r["median_round_s"], 3))
    print(f"| {r['row']} | {r['client_parallelism']} | {r['median_round_s']} | {r['ratio']}x | "
          f"{r['gflops']} | {r['roofline_s']} | {100 * r['fraction_of_roofline']:.0f} % |")
  return {"machine": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
          "jax": jax.__version__, "devices": jax.device_count(), "protocol": BASE,
          "matmul_peaks": peaks, "peak_gflops": peak, "bandwidths": bandwidths, "rows": runs}


def time_sgd_ceiling(rounds: int) -> dict:
  """Plain SGD, batch 64, momentum 0.5, over 60,000 examples: each device runs
  its half as one scan of steps, as one FedAvg client with all of it would."""
  from functools import partial
  import jax.numpy as jnp
  import numpy as np
  import optax
  from jax.sharding import Mesh, PartitionSpec as P
  from fedjax_dp.losses import masked_cross_entropy
  from fedjax_dp.models import make_model
  model = make_model("mlp", (784,), 10, [200, 200])
  mesh = Mesh(np.array(jax.devices()), ("c",))
  steps, b = 60000 // 64 // len(jax.devices()), 64
  n = steps * b * len(jax.devices())
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(n, 784)).astype(np.float32))
  y = jnp.asarray(rng.integers(0, 10, n).astype(np.int32))

  @jax.jit
  @partial(jax.shard_map, mesh=mesh, in_specs=(P(), P("c"), P("c")), out_specs=P())
  def sgd(p, xs, ys):
    p, opt = jax.lax.pcast(p, "c", to="varying"), optax.sgd(0.01, momentum=0.5)
    def step(carry, i):
      q, s = carry
      xb, yb = (jax.lax.dynamic_slice_in_dim(a, i * b, b) for a in (xs, ys))
      g = jax.grad(lambda q: masked_cross_entropy(model.apply(q, xb), yb,
                                                  jnp.ones((b,), bool)))(q)
      u, s = opt.update(g, s, q)
      return (optax.apply_updates(q, u), s), None
    (q, _), _ = jax.lax.scan(step, (p, opt.init(p)), jnp.arange(steps))
    return jax.lax.psum(q, "c")

  params = model.init(jax.random.PRNGKey(0))
  jax.block_until_ready(sgd(params, x, y))
  times = []
  for _ in range(rounds):
    t = time.perf_counter()
    jax.block_until_ready(sgd(params, x, y))
    times.append(time.perf_counter() - t)
  med = statistics.median(times)
  return {"examples": n, "median_s": round(med, 4),
          "gflops": round(6 * num_params(params) * n / med / 1e9, 1)}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--protocol", nargs="+", default=list(PROTOCOLS), choices=list(PROTOCOLS))
  ap.add_argument("--parallelism", nargs="+", default=["auto"],
                  choices=["auto", "map", "vmap", "one_step"])
  ap.add_argument("--dp", nargs="+", default=["none"], choices=list(DP),
                  help="also time the protocols under central or local DP")
  ap.add_argument("--rounds", type=positive_int, default=7, help="timed rounds after compilation")
  ap.add_argument("--sgd-ceiling", action="store_true",
                  help="also time plain batch-64 SGD over the same examples")
  ap.add_argument("--data-dir", default=None)
  ap.add_argument("--json", default=None, type=new_file,
                  help="write the results here too (refuses an existing file)")
  ap.add_argument("--rows", action="store_true",
                  help="time issue 43's rows (one and many steps, central and local DP) on "
                       "auto and map, with the roofline")
  args = ap.parse_args(argv)
  if args.rows:
    result = row_table(args)
    if args.json:
      write_results(result, args.json)
    return

  from peak import measure_matmul_peak
  peaks = [measure_matmul_peak()]
  runs = {f"{p}/{par}" + ("" if dp == "none" else f"/{dp}"):
          time_protocol(PROTOCOLS[p], par, args.rounds, args.data_dir, dp)
          for p in args.protocol for par in args.parallelism for dp in args.dp}
  if args.sgd_ceiling:
    runs["plain_sgd_batch64"] = time_sgd_ceiling(args.rounds)
  peaks.append(measure_matmul_peak())
  peak = max(p["peak_gflops"] for p in peaks)
  for r in runs.values():
    r["fraction_of_peak"] = round(r["gflops"] / peak, 3)
  result = {"machine": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "jax": jax.__version__, "devices": jax.device_count(), "protocol": BASE,
            "matmul_peaks": peaks, "peak_gflops": peak, "runs": runs}
  print(json.dumps(result, indent=2))
  if args.json:
    write_results(result, args.json)


if __name__ == "__main__":
  main()
