"""Round time of two source trees side by side (a refactor against the commit before it).

One worker process per tree (fedjax_dp imported from that tree), each compiling
the same simulation once; the driver then times compiled chunks alternately,
A B B A A B ..., so both trees see the same machine drift, and reports the
median seconds per round of each and the median of the per-cycle ratios.

  git worktree add /tmp/before <commit>
  python benchmarks/compare_trees.py --tree before=/tmp/before --tree after=. \
      [--variant fedavg] [--variant topksdp_bisect] [--chunks 9] [--chunk-rounds 5] [--json OUT]

Variants are benchmarks/fedavg_round.py's protocol (full Fashion-MNIST, 100 clients
all per round, MLP 784-200-200-10, E = 1, B = 64), topksdp_round.py's
TopkSDP-FL with the bisecting top-k and the aggregate's kept noise, and local DP
with the cluster rule's per-cluster noise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from cli_args import new_file, write_results

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOCOL = dict(dataset="fmnist", num_clients=100, clients_per_round=100, partition="dirichlet",
                alpha=0.5, model="mlp", hidden=[200, 200], local_epochs=1, batch_size=64,
                lr=0.01, momentum=0.5, sampling="fixed", seed=0)
VARIANTS = {"fedavg": {},
            "topksdp_bisect": dict(algorithm="topksdp", coordinate_clip=0.05, kept_noise="paper",
                                   ldp_epsilon=3.0, topk_kernel="bisect"),
            # local DP with per-cluster noise (issue 40 moved it into the cluster rule's state)
            "local_dp_cluster_noise": dict(dp="local", noise_multiplier=1.0, clip_norm=1.0,
                                           aggregator="cluster", cluster_threshold=0.2,
                                           cluster_noise="equalize")}


def worker(variant: str, chunk_rounds: int) -> None:
  """Compiles the variant, then times one chunk per 'run' line on stdin."""
  import time
  from fedjax_dp.placement.host import use_cpu_devices_or_exit
  use_cpu_devices_or_exit()
  import jax
  from fedjax_dp import make_config
  try:
    from fedjax_dp.experiment.setup import setup
  except ImportError:   # a tree from before setup.py split off the runner
    from fedjax_dp import runner
    setup = runner.setup
  _, _, sim = setup(make_config(dict(PROTOCOL, **VARIANTS[variant])))
  state, _ = sim.run_working(sim.to_working(sim.init_state()), chunk_rounds)   # compile
  jax.block_until_ready(state)
  print("ready", flush=True)
  for line in sys.stdin:
    if line.strip() != "run":
      break
    t = time.perf_counter()
    state, _ = sim.run_working(state, chunk_rounds)
    jax.block_until_ready(state)
    print((time.perf_counter() - t) / chunk_rounds, flush=True)


def start(tree: str, variant: str, chunk_rounds: int) -> subprocess.Popen:
  env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
  proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", variant,
                           "--chunk-rounds", str(chunk_rounds)], cwd=os.path.abspath(tree),
                          env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  line = proc.stdout.readline().strip()
  if line != "ready":
    raise SystemExit(f"the worker for {tree} did not start (got {line!r})")
  return proc


def compare(trees: dict[str, str], variant: str, chunks: int, chunk_rounds: int) -> dict:
  names = list(trees)
  procs = {name: start(path, variant, chunk_rounds) for name, path in trees.items()}
  times = {name: [] for name in names}
  for cycle in range(chunks):
    for name in (names if cycle % 2 == 0 else names[::-1]):   # A B, B A, ...
      procs[name].stdin.write("run\n")
      procs[name].stdin.flush()
      times[name].append(float(procs[name].stdout.readline()))
  for p in procs.values():
    p.stdin.close()
    p.wait()
  base, new = names
  med = {n: statistics.median(ts) for n, ts in times.items()}
  return {"variant": variant, "seconds_per_round_median": med, "all": times,
          f"{new}_over_{base}": med[new] / med[base],
          f"{new}_over_{base}_paired": statistics.median(
              b / a for a, b in zip(times[base], times[new]))}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--tree", action="append", default=[], metavar="NAME=PATH")
  ap.add_argument("--variant", action="append", choices=sorted(VARIANTS))
  ap.add_argument("--chunks", type=int, default=9)
  ap.add_argument("--chunk-rounds", type=int, default=5)
  ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  ap.add_argument("--json", default=None, type=new_file,
                  help="write the results here too (refuses an existing file)")
  args = ap.parse_args(argv)
  if args.worker:
    return worker(args.worker, args.chunk_rounds)
  trees = dict(t.split("=", 1) for t in args.tree)
  if len(trees) != 2 or not all(os.path.isdir(p) for p in trees.values()):
    ap.error(f"--tree: two NAME=PATH with existing folders needed, got {args.tree}")
  out = [compare(trees, v, args.chunks, args.chunk_rounds) for v in args.variant or ["fedavg"]]
  print(json.dumps(out, indent=1))
  if args.json:
    write_results(out, args.json, indent=1)


if __name__ == "__main__":
  main()
