"""Reproduces TopkSDP-FL's evaluation (Table 2, Table 1 / Fig. 6, Fig. 9, Tables 3-4).

  python experiments/topksdp/run.py table2 --levels medium --seeds 0 1
  python experiments/topksdp/run.py table2 --levels low medium high --seeds 0 1 2
  python experiments/topksdp/run.py sparsity --seeds 0          # Table 1 / Fig. 6
  python experiments/topksdp/run.py privacy --seeds 0           # Fig. 9: epsilon x sparsity
  python experiments/topksdp/run.py mu --seeds 0                # Tables 3-4: the mu grid
  options: --dataset fmnist|mnist|cifar10 --data-dir DIR --rounds N --out DIR

Every run is a normal `fedjax-dp run` output folder under --out (resumable: an
existing finished run is reused, never overwritten). The script writes
results.csv, results.md (our numbers beside the paper's, labelled) and plots.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))

from fedjax_dp.host import use_cpu_devices  # noqa: E402

use_cpu_devices()

from fedjax_dp.config import load_config  # noqa: E402
from fedjax_dp.runner import run_experiment  # noqa: E402

LEVELS = {"low": 1.0, "medium": 0.5, "high": 0.1}   # Dirichlet alpha: our reading
ALGORITHMS = ["topksdp", "fedavg", "fedprox", "scaffold", "moon", "fedadmm", "solo"]
PAPER_OVERRIDES = {"fedprox": {"prox_mu": 0.001}, "moon": {"moon_mu": 1.0, "moon_tau": 0.5}}

# The paper's Table 2 (test accuracy %, 200 rounds), as its text states them: TopkSDP-FL's
# figures directly, the others from the stated differences (e.g. "84.83 %, surpassing
# FedAvg by 2.02 %" gives FedAvg 82.81). Missing where the text does not give them.
PAPER_TABLE2 = {
    ("fmnist", "medium"): {"topksdp": 84.83, "fedavg": 82.81, "fedprox": 82.93,
                           "fedadmm": 82.82, "scaffold": 82.98, "moon": 81.88},
    ("fmnist", "low"): {"topksdp": 88.74, "fedavg": 88.61, "fedprox": 88.56},
    ("fmnist", "high"): {"topksdp": 82.06, "fedavg": 75.38, "fedprox": 75.22},
    ("mnist", "medium"): {"topksdp": 96.61, "fedavg": 94.94, "fedprox": 94.84, "fedadmm": 94.22},
    ("mnist", "low"): {"topksdp": 97.65, "fedavg": 97.46, "fedprox": 97.47},
    ("mnist", "high"): {"topksdp": 92.46, "fedavg": 77.39, "fedprox": 80.12},
    ("cifar10", "medium"): {"topksdp": 62.59, "fedavg": 58.98, "fedprox": 60.35,
                            "fedadmm": 60.05},
    ("cifar10", "low"): {"topksdp": 64.23, "fedavg": 60.63, "fedprox": 61.13},
    ("cifar10", "high"): {"topksdp": 53.15, "fedavg": 47.53, "fedprox": 50.93},
}


def run_one(out_root: str, name: str, sets: dict, args) -> dict:
  out = os.path.join(out_root, name)
  summary_path = os.path.join(out, "summary.json")
  if os.path.exists(summary_path):           # finished before: reuse, never overwrite
    with open(summary_path) as f:
      return json.load(f)
  overrides = dict(sets, dataset=args.dataset, rounds=args.rounds)
  if args.data_dir:
    overrides["data_dir"] = args.data_dir
  if args.dataset == "cifar10":
    overrides.setdefault("model", "cnn")
    overrides.setdefault("hidden", [512])
  cfg = load_config(os.path.join(HERE, "base.yaml"),
                    [f"{k}={json.dumps(v)}" for k, v in overrides.items()])
  resume = os.path.exists(os.path.join(out, "config.json"))
  print(f"[run] {name}", flush=True)
  return run_experiment(cfg, out, resume=resume, progress=False, log=lambda m: None)


def table2(args) -> list[dict]:
  rows = []
  for level in args.levels:
    for alg in args.algorithms:
      for seed in args.seeds:
        sets = dict(PAPER_OVERRIDES.get(alg, {}), algorithm=alg, alpha=LEVELS[level], seed=seed)
        s = run_one(args.out, f"table2/{level}/{alg}/seed{seed}", sets, args)
        rows.append({"level": level, "alpha": LEVELS[level], "algorithm": alg, "seed": seed,
                     "final_accuracy": s["final"]["test_accuracy"],
                     "best_accuracy": s["best_test_accuracy"],
                     "bytes_up": s["communication"]["bytes_up"],
                     "bytes_down": s["communication"]["bytes_down"],
                     "wall_s": s["timing"]["wall_s"]})
  return rows


def sparsity(args) -> list[dict]:
  rows = []
  for s_global in [0.0, 0.5, 0.7, 0.9, 0.95, 0.99]:
    for seed in args.seeds:
      sets = dict(algorithm="topksdp", s_global=s_global, seed=seed)
      s = run_one(args.out, f"sparsity/sg{s_global}/seed{seed}", sets, args)
      rows.append({"s_global": s_global, "seed": seed,
                   "final_accuracy": s["final"]["test_accuracy"],
                   "mb_per_round_trip": (s["communication"]["bytes_per_client_up"] +
                                         s["communication"]["bytes_per_client_down"]) / 1e6})
  return rows


def privacy(args) -> list[dict]:
  rows = []
  for eps in [1.0, 3.0, 50.0]:
    for s_local in [0.5, 0.9, 0.99]:
      for seed in args.seeds:
        sets = dict(algorithm="topksdp", s_local=s_local, kept_noise="paper", ldp_epsilon=eps,
                    coordinate_clip=0.05, seed=seed)
        s = run_one(args.out, f"privacy/eps{eps}/sl{s_local}/seed{seed}", sets, args)
        kn = s["privacy"]["kept_noise"]
        rows.append({"ldp_epsilon": eps, "s_local": s_local, "seed": seed,
                     "final_accuracy": s["final"]["test_accuracy"],
                     "papers_chain_epsilon": kn.get("papers_chain", {}).get("epsilon"),
                     "accountant_epsilon": kn["accountant"]["epsilon"]})
  return rows


def mu(args) -> list[dict]:
  rows = []
  grid = [0.001, 0.005, 0.01]
  for mu1 in grid:
    for mu2 in grid:
      for seed in args.seeds:
        sets = dict(algorithm="topksdp", contrastive_mu1=mu1, contrastive_mu2=mu2, seed=seed)
        s = run_one(args.out, f"mu/mu1_{mu1}/mu2_{mu2}/seed{seed}", sets, args)
        rows.append({"mu1": mu1, "mu2": mu2, "seed": seed,
                     "final_accuracy": s["final"]["test_accuracy"]})
  return rows


def write_outputs(kind: str, rows: list[dict], args) -> None:
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, f"{kind}.csv")
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
  lines = [f"# {kind}: {args.dataset}, {args.rounds} rounds, seeds {args.seeds}", ""]
  if kind == "table2":
    lines += ["Test accuracy % at the last round: mean ± sd over seeds (ours), and the "
              "paper's Table 2 where its text gives the number (directly, or by the "
              "differences it states). The paper's figures are its own, from its own "
              "protocol; ours are from `base.yaml`.", "",
              "| heterogeneity (alpha) | algorithm | ours | best round (ours) | paper |",
              "| --- | --- | --- | --- | --- |"]
    for level in args.levels:
      paper = PAPER_TABLE2.get((args.dataset, level), {})
      for alg in args.algorithms:
        acc = [100 * r["final_accuracy"] for r in rows if r["level"] == level
               and r["algorithm"] == alg]
        best = [100 * r["best_accuracy"] for r in rows if r["level"] == level
                and r["algorithm"] == alg]
        sd = f" ± {statistics.stdev(acc):.2f}" if len(acc) > 1 else ""
        p = paper.get(alg)
        lines.append(f"| {level} ({LEVELS[level]}) | {alg} | {statistics.mean(acc):.2f}{sd} | "
                     f"{statistics.mean(best):.2f} | {p if p is not None else 'n/a'} |")
  else:
    lines += ["| " + " | ".join(rows[0]) + " |", "|" + " --- |" * len(rows[0])]
    for r in rows:
      lines.append("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v)
                                     for v in r.values()) + " |")
  with open(os.path.join(args.out, f"{kind}.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  if kind == "table2":
    plot_table2(rows, args)
  print(f"results: {path}, {os.path.join(args.out, kind + '.md')}")


def plot_table2(rows, args) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  for level in args.levels:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for alg in args.algorithms:
      curves = []
      for seed in args.seeds:
        path = os.path.join(args.out, f"table2/{level}/{alg}/seed{seed}", "metrics.jsonl")
        with open(path) as f:
          curves.append([json.loads(line) for line in f])
      rounds = [r["round"] for r in curves[0]]
      mean = [statistics.mean(c[i]["test_accuracy"] for c in curves) for i in range(len(rounds))]
      ax.plot(rounds, [100 * m for m in mean], label=alg)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy % (mean over seeds)")
    ax.set_title(f"{args.dataset}, {level} heterogeneity (alpha {LEVELS[level]})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, f"table2_{level}.png"), dpi=120)
    plt.close(fig)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("kind", choices=["table2", "sparsity", "privacy", "mu"])
  ap.add_argument("--levels", nargs="+", default=["medium"], choices=list(LEVELS))
  ap.add_argument("--algorithms", nargs="+", default=ALGORITHMS, choices=ALGORITHMS)
  ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
  ap.add_argument("--dataset", default="fmnist", choices=["fmnist", "mnist", "cifar10"])
  ap.add_argument("--data-dir", default=None)
  ap.add_argument("--rounds", type=int, default=200)
  ap.add_argument("--out", default=os.path.join(HERE, "results", "fmnist"))
  args = ap.parse_args(argv)
  rows = {"table2": table2, "sparsity": sparsity, "privacy": privacy, "mu": mu}[args.kind](args)
  write_outputs(args.kind, rows, args)
  return 0


if __name__ == "__main__":
  sys.exit(main())
