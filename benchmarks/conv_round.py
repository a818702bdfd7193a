"""Convolution models' rounds with autodiff's convolution gradients against
models/conv.py's (the gradients in XLA:CPU's canonical form), side by side in one
invocation: a FedAvg round of 10 clients x 60 images, 6 local steps of 10 each
(a while loop), medians of repeats, alternating the two.

  python benchmarks/conv_round.py [--models cnn,leaf_cnn] [--repeats 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import numpy as np
from jax import lax

from cli_args import new_file
from fedjax_dp import make_config
from fedjax_dp.core.build import build_simulation
from fedjax_dp.core.simulation import make_mesh
from fedjax_dp.models import cnn, make_model, resnet
from fedjax_dp.models.conv import conv_general_dilated
from fedjax_dp.placement.store import build_store
from fedjax_dp.recipes.plan import plan_run

SHAPES = {"cnn": (28, 28, 1), "leaf_cnn": (28, 28, 1), "resnet18": (32, 32, 3)}


def simulation(name: str):
  rng = np.random.default_rng(0)
  x = rng.random((600,) + SHAPES[name], np.float32)
  y = rng.integers(0, 10, 600).astype(np.int32)
  parts = np.array_split(np.arange(600), 10)
  cfg = make_config(dict(model=name, num_clients=10, clients_per_round=10, batch_size=10,
                         local_epochs=1, lr=0.01, client_parallelism="map", devices=1))
  model = make_model(name, x.shape[1:], 10, cfg.hidden)
  store = build_store(x, y, parts, pad_to_multiple=cfg.batch_size)
  return build_simulation(plan_run(cfg, model, None), model, store, make_mesh(1))


def round_seconds(name: str, conv) -> float:
  """Seconds of one round after a compiling one, the models' convolution `conv`."""
  cnn.conv_general_dilated = resnet.conv_general_dilated = conv
  sim = simulation(name)
  state, _ = sim.run_rounds(sim.init_state(), 1)
  jax.block_until_ready(state.params)
  start = time.perf_counter()
  state, _ = sim.run_rounds(state, 1)
  jax.block_until_ready(state.params)
  return time.perf_counter() - start


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--models", default="cnn,leaf_cnn")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--json", type=new_file)
  args = ap.parse_args()
  out = {}
  for name in args.models.split(","):
    runs = {"autodiff": [], "canonical": []}
    for _ in range(args.repeats):
      runs["autodiff"].append(round_seconds(name, lax.conv_general_dilated))
      runs["canonical"].append(round_seconds(name, conv_general_dilated))
    med = {k: statistics.median(v) for k, v in runs.items()}
    out[name] = dict(med, ratio=med["autodiff"] / med["canonical"], runs=runs)
    print(f"{name}: autodiff gradients {med['autodiff']:.3f} s a round, canonical "
          f"{med['canonical']:.3f} s: {out[name]['ratio']:.1f}x", flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)


if __name__ == "__main__":
  main()
