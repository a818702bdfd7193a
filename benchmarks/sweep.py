"""Replica speed (issue 21 item 2): a sweep of seeds against the same runs one by one.

  python benchmarks/sweep.py [--seeds 16] [--repeats 3] [--fmnist] [--json PATH]

Demo arms (experiments/demo.yaml, 60 rounds; seed i with data_seed 0, as a sweep's
seeds are), each timed as the wall time a user waits for, alternated `--repeats`
times in one invocation (medians reported):

  cli_runs     `fedjax-dp run` once per seed, one process after the other
  in_process   run_experiment once per seed in one Python process (each builds and
               compiles its own simulation)
  sweep        `fedjax-dp sweep` of the seeds (replica_batch auto: 1 on CPU, one
               compiled program, the seeds one after the other)
  sweep_vmap   the same with --replica-batch equal to the seeds (one vmapped program)

--fmnist adds the Fashion-MNIST core protocol (benchmarks/fedavg_round.py: 100
clients x ~600 examples, MLP 784-200-200-10): seconds per replica-round of a
single run's compiled chunk against R replicas vmapped in one chunk (replica_batch
R), with this machine's matmul peak measured in the same invocation. replica_batch
1 runs the single run's own program, so its figure is the single run's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

from cli_args import new_file, positive_int, write_results  # noqa: E402

DEMO = os.path.join(ROOT, "experiments", "demo.yaml")
# the console script beside this Python, else the same entry point by module (a
# machine where the project is on PYTHONPATH, not installed)
_SCRIPT = os.path.join(os.path.dirname(sys.executable), "fedjax-dp")
CLI = [_SCRIPT] if os.path.exists(_SCRIPT) else [sys.executable, "-m", "fedjax_dp"]
ARMS = ("sweep", "sweep_vmap", "cli_runs", "in_process")


def cli_runs(seeds: int, tmp: str) -> float:
  t = time.perf_counter()
  for s in range(seeds):
    subprocess.run([*CLI, "run", "--config", DEMO, "--set", f"seed={s}", "data_seed=0",
                    "--out", os.path.join(tmp, f"run{s}"), "--no-progress"], check=True,
                   capture_output=True)
    print(f"  cli run {s}: {time.perf_counter() - t:.1f} s so far", file=sys.stderr)
  return time.perf_counter() - t


def in_process(seeds: int, tmp: str) -> float:
  """Runs in a child process (fresh memos and compiles), timed from inside."""
  code = (f"import sys, time; sys.path.insert(0, {ROOT!r})\n"
          "from fedjax_dp.placement.host import use_cpu_devices_or_exit; use_cpu_devices_or_exit()\n"
          "t = time.perf_counter()\n"
          "from fedjax_dp import load_config, make_config\n"
          "from fedjax_dp.experiment.runner import run_experiment\n"
          f"base = load_config({DEMO!r})\n"
          f"for s in range({seeds}):\n"
          "  run_experiment(make_config({'seed': s, 'data_seed': 0}, base=base), "
          f"{tmp!r} + f'/p{{s}}', progress=False, log=lambda m: None)\n"
          "print(time.perf_counter() - t)\n")
  t = time.perf_counter()
  out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
  inside = float(out.stdout.strip().splitlines()[-1])
  return time.perf_counter() - t, inside


def sweep(seeds: int, tmp: str, name: str, replica_batch: str) -> float:
  path = os.path.join(tmp, f"{name}.yaml")
  with open(path, "w") as f:
    f.write(f"base: {DEMO}\nseeds: {seeds}\nreplica_batch: {replica_batch}\n")
  t = time.perf_counter()
  subprocess.run([*CLI, "sweep", path, "--out", os.path.join(tmp, name), "--no-progress"],
                 check=True, capture_output=True)
  return time.perf_counter() - t


def demo_arms(seeds: int, repeats: int, chosen=ARMS) -> dict:
  times: dict[str, list[float]] = {"cli_runs": [], "in_process": [], "in_process_inside": [],
                                   "sweep": [], "sweep_vmap": []}
  for r in range(repeats):
    with tempfile.TemporaryDirectory() as tmp:
      arms = [("sweep", lambda: sweep(seeds, tmp, f"s{r}", "auto")),
              ("sweep_vmap", lambda: sweep(seeds, tmp, f"v{r}", str(seeds))),
              ("cli_runs", lambda: cli_runs(seeds, tmp)),
              ("in_process", lambda: in_process(seeds, tmp))]
      arms = [a for a in arms if a[0] in chosen]
      for name, fn in (arms if r % 2 == 0 else arms[::-1]):
        value = fn()
        if name == "in_process":
          value, inside = value
          times["in_process_inside"].append(inside)
        times[name].append(value)
        print(f"repeat {r}: {name} {value:.1f} s", file=sys.stderr)
  med = {k: statistics.median(v) for k, v in times.items() if v}
  out = {"seeds": seeds, "seconds": times, "median_s": med}
  ratios = {"sweep_speedup_over_cli_runs": ("cli_runs", "sweep"),
            "sweep_speedup_over_in_process": ("in_process", "sweep"),
            "sweep_vmap_speedup_over_cli_runs": ("cli_runs", "sweep_vmap"),
            "sweep_vmap_over_sweep": ("sweep_vmap", "sweep")}
  out.update({k: med[a] / med[b] for k, (a, b) in ratios.items() if a in med and b in med})
  return out


def fmnist_arm(replicas: int, rounds: int, repeats: int) -> dict:
  """Seconds per replica-round: a single run's chunk against `replicas` vmapped."""
  from fedjax_dp.placement.host import use_cpu_devices_or_exit
  use_cpu_devices_or_exit()
  import jax
  import jax.numpy as jnp
  from fedavg_round import PROTOCOL
  from fedjax_dp import make_config
  from fedjax_dp.experiment.setup import setup
  from peak import measure_matmul_peak
  _, _, sim = setup(make_config(dict(PROTOCOL, data_seed=0)))
  sims = [sim.with_seed(s) for s in range(replicas)]
  stack = lambda trees: jax.tree.map(lambda *xs: jnp.stack(xs), *trees)

  def single():
    state, _ = sim.run_rounds(sim.init_state(), rounds)   # compiled for this length, warm
    jax.block_until_ready(state)
    t = time.perf_counter()
    state, _ = sim.run_rounds(state, rounds)
    jax.block_until_ready(state)
    return (time.perf_counter() - t) / rounds

  def batched():
    states, _ = sim.run_replicas(stack([s.init_state() for s in sims]),
                                 stack([s.hparams for s in sims]), rounds)
    jax.block_until_ready(states)
    t = time.perf_counter()
    states, _ = sim.run_replicas(states, stack([s.hparams for s in sims]), rounds)
    jax.block_until_ready(states)
    return (time.perf_counter() - t) / rounds / replicas

  peak = measure_matmul_peak()
  one, many = [], []
  for r in range(repeats):
    for name, fn in ([("one", single), ("many", batched)] if r % 2 == 0 else
                     [("many", batched), ("one", single)]):
      (one if name == "one" else many).append(fn())
  return {"replicas": replicas, "rounds": rounds, "peak": peak,
          "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
          "single_s_per_round": one, "vmapped_s_per_replica_round": many,
          "single_median": statistics.median(one),
          "vmapped_median": statistics.median(many),
          "vmapped_over_single": statistics.median(many) / statistics.median(one)}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--seeds", type=positive_int, default=16)
  p.add_argument("--repeats", type=positive_int, default=3)
  p.add_argument("--fmnist", action="store_true", help="also the Fashion-MNIST protocol")
  p.add_argument("--fmnist-replicas", type=positive_int, default=4)
  p.add_argument("--fmnist-rounds", type=positive_int, default=3)
  p.add_argument("--skip-demo", action="store_true")
  p.add_argument("--arms", default=",".join(ARMS),
                 help=f"demo arms to time, comma-separated (default all: {', '.join(ARMS)})")
  p.add_argument("--json", type=new_file, help="write the results here (a new file)")
  args = p.parse_args(argv)
  arms = [a for a in args.arms.split(",") if a]
  if not arms or any(a not in ARMS for a in arms):
    p.error(f"--arms {args.arms!r}: allowed are {', '.join(ARMS)} (comma-separated)")
  result = {"machine": {"cpu": platform.processor() or platform.machine(),
                        "cores": os.cpu_count()}}
  if not args.skip_demo:
    result["demo"] = demo_arms(args.seeds, args.repeats, arms)
  if args.fmnist:
    result["fmnist"] = fmnist_arm(args.fmnist_replicas, args.fmnist_rounds, args.repeats)
  print(json.dumps(result, indent=2))
  if args.json:
    write_results(result, args.json)
  return 0


if __name__ == "__main__":
  sys.exit(main())
