"""What every peer of benchmarks/scaling.py shares: its arguments, the data and the result line.

The protocol (scaling.py's points, as each peer's own user would write it):
N clients of 2 examples each (32 features, 10 classes: fedjax_dp's synthetic Gaussian
classes, iid partition, seed 0, written by scaling.py to an .npz so that every library
trains on the same arrays), a cohort of C clients drawn uniformly without replacement
each round, E = 1, batch 64 (one step a client), client SGD lr 0.05 without momentum,
MLP 32-64-10 (ReLU, 2,762 parameters), FedAvg weighted by examples with server lr 1 (`--algorithm fedavg`, the stateless
points), or SCAFFOLD, option II, each client's control variate kept between rounds
(`--algorithm scaffold`, the stateful points; only peers that ship it accept it).
A round ends when the new global model is on the server; one warm-up round, then the
median of --rounds timed rounds.

Stdlib and NumPy only: it runs in each peer's own venv.

  .npz:  x [2N, 32] float32, y [2N] int32 (client order), starts [N + 1] int64:
         client i holds rows starts[i]:starts[i + 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import time

import numpy as np

FEATURES, HIDDEN, CLASSES = 32, 64, 10
BATCH, CLIENT_LR, SERVER_LR = 64, 0.05, 1.0


def parse_args(description: str, argv=None, algorithms=("fedavg",)) -> argparse.Namespace:
  ap = argparse.ArgumentParser(description=description)
  ap.add_argument("--algorithm", default="fedavg", choices=algorithms,
                  help="fedavg (stateless) or scaffold (stateful), where this peer ships it")
  ap.add_argument("--data", required=True, help="the .npz scaling.py wrote")
  ap.add_argument("--cohort", type=int, required=True, help="clients per round")
  ap.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up round")
  args = ap.parse_args(argv)
  if args.cohort < 1 or args.rounds < 1:
    ap.error(f"--cohort {args.cohort} and --rounds {args.rounds}: both must be >= 1")
  return args


def load(path: str):
  """(x [n, 32] float32, y [n] int32, starts [N + 1] int64)."""
  with np.load(path) as f:
    return f["x"], f["y"], f["starts"]


class Clock:
  """Setup time from construction; round times from start() / stop() pairs."""

  def __init__(self):
    self.t0 = time.perf_counter()
    self.setup_s = None
    self.rounds: list[float] = []
    self._start = None

  def setup_done(self):
    self.setup_s = time.perf_counter() - self.t0

  def start(self):
    self._start = time.perf_counter()

  def stop(self):
    self.rounds.append(time.perf_counter() - self._start)


def result(library: str, versions: dict, clients: int, cohort: int, clock: Clock,
           **extra) -> dict:
  """The one JSON line scaling.py reads: the first round is the warm-up."""
  timed = clock.rounds[1:]
  if not timed:
    raise RuntimeError(f"{library}: no timed round (rounds seen: {len(clock.rounds)})")
  med = statistics.median(timed)
  return {"library": library, **versions, "clients": clients, "cohort": cohort,
          "setup_s": round(clock.setup_s or 0.0, 2), "warmup_round_s": round(clock.rounds[0], 4),
          "round_s": [round(t, 4) for t in timed], "median_round_s": round(med, 4),
          "clients_per_s": round(cohort / med),
          "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
          "machine": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
          **extra}


def emit(res: dict) -> None:
  print(json.dumps(res), flush=True)
