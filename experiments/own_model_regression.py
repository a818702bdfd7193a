"""Your own flax model, loss and numpy data through fedjax_dp.run, with central DP.

  python experiments/own_model_regression.py --out runs/regression
  python experiments/own_model_regression.py --out runs/regression --resume --rounds 60

The data is synthetic and yours to replace: y = x . w + b + noise over
`--features` features, split over `--clients` clients of different sizes, each
with its own shift of the features (mildly non-IID); a fifth as many clients
more, none of them training, give the test set (under DP the test metrics are
published unnoised, so they must come from data that is no client's). The model is a small MLP
regressor (a flax.linen module), trained with the mean squared error under
central DP (DP-FedAvg: clip each client's update, noise the sum). The run folder
gets what `fedjax-dp run` writes: metrics.jsonl (test_mse, test_mae, train_loss,
epsilon, ...), summary.json with the privacy report, plots and checkpoints.
A non-empty --out is never overwritten; --resume continues it bit for bit
(only --rounds may change). Bad input is a one-line error, exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from fedjax_dp.placement.host import use_cpu_devices_or_exit  # noqa: E402

use_cpu_devices_or_exit()   # before JAX starts: one CPU device per core

import flax.linen as nn  # noqa: E402
import numpy as np  # noqa: E402

import fedjax_dp  # noqa: E402
from fedjax_dp.cli import OneLineParser, exit_with, run_guarded  # noqa: E402


class Regressor(nn.Module):
  """x [B, d] -> [B, 1]: Dense(hidden) -> ReLU -> Dense(1)."""
  hidden: int = 32

  @nn.compact
  def __call__(self, x):
    return nn.Dense(1)(nn.relu(nn.Dense(self.hidden)(x)))


def synthetic_clients(clients: int, features: int, seed: int):
  """(x [N, d] float32, y [N] float32, client_ids [N]): y = x . w + 0.5 + N(0, 0.1^2);
  client sizes 20..120, client k's features shifted by its own N(0, 0.5^2) offset."""
  rng = np.random.default_rng(seed)
  w = rng.normal(size=features) / np.sqrt(features)
  sizes = rng.integers(20, 121, size=clients)
  ids = np.repeat(np.arange(clients), sizes)
  shift = rng.normal(scale=0.5, size=(clients, features))
  x = (rng.normal(size=(len(ids), features)) + shift[ids]).astype(np.float32)
  y = (x @ w + 0.5 + rng.normal(scale=0.1, size=len(ids))).astype(np.float32)
  return x, y, ids


def parse_args(argv=None):
  p = OneLineParser(prog="own_model_regression.py",
                    description="a flax regressor on your numpy data, with central DP")
  p.add_argument("--out", required=True, help="run folder (must be empty or absent)")
  p.add_argument("--resume", action="store_true", help="continue the run in --out")
  p.add_argument("--rounds", type=int, default=40)
  p.add_argument("--clients", type=int, default=200)
  p.add_argument("--clients-per-round", type=int, default=20)
  p.add_argument("--features", type=int, default=8)
  p.add_argument("--noise-multiplier", type=float, default=1.0)
  p.add_argument("--eval-every", type=int, default=5)
  p.add_argument("--checkpoint-every", type=int, default=10)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--no-progress", action="store_true")
  return p.parse_args(argv)


def main(args) -> int:
  # a fifth more clients than train, whose rows are the test set: under DP the test
  # metrics are published unnoised, so they come from data that is no client's
  x, y, ids = synthetic_clients(args.clients + max(1, args.clients // 5), args.features,
                                args.seed)
  train = ids < args.clients
  data = fedjax_dp.data.from_arrays(x[train], y[train], client_ids=ids[train],
                                    test=(x[~train], y[~train]), seed=args.seed,
                                    name="synthetic linear regression")
  model = fedjax_dp.models.from_flax(Regressor(), x[:1], name="mlp_regressor")
  summary = fedjax_dp.run(
      "dp_fedavg", model=model, data=data, loss="mse", rounds=args.rounds, out=args.out,
      resume=args.resume, progress=not args.no_progress,
      # central DP: each client's update clipped to L2 norm 0.5, N(0, (z 0.5)^2) on the sum
      noise_multiplier=args.noise_multiplier, clip_norm=0.5, sampling="poisson",
      clients_per_round=args.clients_per_round, lr=0.05, momentum=0.0, batch_size=16,
      server_lr=1.0, eval_every=args.eval_every, checkpoint_every=args.checkpoint_every,
      seed=args.seed)
  final, privacy = summary["final"], summary["privacy"]
  print(f"round {final['round']}: test mse {final['test_mse']:.4f}, test mae "
        f"{final['test_mae']:.4f}; epsilon {privacy['epsilon']:.3g} at delta {privacy['delta']:g}")
  print(f"results: {os.path.abspath(args.out)}")
  return 0


if __name__ == "__main__":
  arguments = parse_args()
  exit_with(run_guarded(lambda: main(arguments)))
