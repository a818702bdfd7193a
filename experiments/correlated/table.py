"""The correlated-noise sweep's table: final test accuracy (mean +- sd over seeds)
by mechanism and epsilon, beside each mechanism's noise: the noise multiplier, a
round's noise on the mean update and the error of the noisy prefix sums the model
follows (root mean square per coordinate, over the expected cohort; DP-FedAvg's
independent noise: z C / m a round, z C sqrt((rounds + 1) / 2) / m for the prefix
sums).

  python experiments/correlated/table.py runs/correlated-fmnist [--plot curves.png]

--plot also draws the accuracy curves (the sweep's results.csv, mean over seeds), one
panel per epsilon, one line per mechanism.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections import defaultdict

import numpy as np


def cells(folder: str):
  """(mechanism label, epsilon, summary, config) of each cell."""
  for name in sorted(os.listdir(os.path.join(folder, "cells"))):
    d = os.path.join(folder, "cells", name)
    summary = json.load(open(os.path.join(d, "summary.json")))
    cfg = json.load(open(os.path.join(d, "config.json")))
    yield label(cfg), cfg["target_epsilon"], summary, cfg


def label(cfg: dict) -> str:
  if cfg["dp"] == "central":
    return f"DP-FedAvg, {cfg['sampling']} (amplified)"
  amplified = cfg["dp"] == "bandmf" and cfg["sampling"] == "cyclic_poisson"
  b = cfg.get("min_separation") or cfg["num_clients"] // cfg["clients_per_round"]
  return f"{cfg['dp']}, {cfg['sampling']} b={b}" + (" (amplified)" if amplified else "")


def noise(summary: dict, cfg: dict) -> tuple[float, float, float]:
  """(z, a round's noise rms, the prefix sums' error rms) on the mean update."""
  p, m, c = summary["privacy"], cfg["clients_per_round"], cfg["clip_norm"]
  z = p["noise_multiplier"]
  if "correlated_noise" in p:
    cn = p["correlated_noise"]
    return z, cn["round_noise_rms"] / m, cn["prefix_sum_error_rms"] / m
  return z, z * c / m, z * c * math.sqrt((cfg["rounds"] + 1) / 2) / m


def table(folder: str) -> str:
  acc, noises, wall = defaultdict(list), {}, defaultdict(list)
  for name, eps, summary, cfg in cells(folder):
    acc[name, eps].append(summary["final"]["test_accuracy"])
    noises[name, eps] = noise(summary, cfg)
    wall[name].append(summary["timing"]["wall_s"])
  names = sorted({n for n, _ in acc}, key=lambda n: (not n.startswith("DP-FedAvg"), n))
  epsilons = sorted({e for _, e in acc})
  head = "| delta 1e-6 | " + " | ".join(f"epsilon {e:g}" for e in epsilons) + " |"
  lines = [head, "|" + " --- |" * (len(epsilons) + 1)]
  for n in names:
    row = [f"{100 * np.mean(acc[n, e]):.1f} +- {100 * np.std(acc[n, e], ddof=1):.1f} %"
           for e in epsilons]
    lines.append(f"| {n} | " + " | ".join(row) + " |")
  lines += ["", "Noise on the mean update (z; a round's rms / the prefix sums' rms error):", "",
            head, "|" + " --- |" * (len(epsilons) + 1)]
  for n in names:
    row = [f"{z:.3g}; {r:.3g} / {p:.3g}" for z, r, p in (noises[n, e] for e in epsilons)]
    lines.append(f"| {n} | " + " | ".join(row) + " |")
  lines += ["", "Median wall time per run: " + ", ".join(
      f"{n} {np.median(wall[n]):.0f} s" for n in names)]
  return "\n".join(lines)


def curves(folder: str, path: str) -> None:
  """The test accuracy by round, mean over seeds: a panel per epsilon."""
  import csv
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  labels = {cfg_name: label(cfg) for cfg_name, cfg in _configs(folder)}
  acc = defaultdict(list)
  with open(os.path.join(folder, "results.csv")) as f:
    for row in csv.DictReader(f):
      key = (labels[row["cell"]], float(row["target_epsilon"]), int(row["round"]))
      acc[key].append(float(row["test_accuracy"]))
  epsilons = sorted({e for _, e, _ in acc})
  names = sorted({n for n, _, _ in acc}, key=lambda n: (not n.startswith("DP-FedAvg"), n))
  fig, axes = plt.subplots(1, len(epsilons), figsize=(4 * len(epsilons), 3.6), sharey=True)
  for ax, eps in zip(np.atleast_1d(axes), epsilons):
    for n in names:
      rounds = sorted(r for m, e, r in acc if m == n and e == eps)
      ax.plot(rounds, [100 * np.mean(acc[n, eps, r]) for r in rounds], label=n)
    ax.set(title=f"epsilon {eps:g}", xlabel="round")
  np.atleast_1d(axes)[0].set_ylabel("test accuracy (%)")
  np.atleast_1d(axes)[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=90)


def _configs(folder: str):
  for name in sorted(os.listdir(os.path.join(folder, "cells"))):
    yield name, json.load(open(os.path.join(folder, "cells", name, "config.json")))


if __name__ == "__main__":
  args = sys.argv[1:]
  folder = args[0] if args and not args[0].startswith("--") else "runs/correlated-fmnist"
  print(table(folder))
  if "--plot" in args:
    curves(folder, args[args.index("--plot") + 1])
