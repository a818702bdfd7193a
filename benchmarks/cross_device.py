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
  args = ap.parse_args(argv)

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
