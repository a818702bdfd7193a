"""A partial cohort's per-client table, sharded over the devices against replicated.

With a cohort drawn each round, a stage's per-client state (SCAFFOLD's control
variates here) lives in a [clients, d] table. It used to be replicated on every
device; it is now sharded in blocks of client ids (placement/executor.py,
`table_rows`), every slot's row fetched in one exchange before the client loop.
This measures both on scaling.py's stateful protocol (synthetic data, MLP
32-64-10, 2 examples a client, SCAFFOLD, a fixed cohort): seconds a round and
the process's peak resident memory. Each arm runs in its own process (its peak
memory is its own), the arms alternating `--repeats` times in one invocation;
each process reports the median of `--rounds` rounds after compilation, and
the table reports the medians over the repeats. Both arms must release the
same bits (checked on the final model's digest).

  python benchmarks/sharded_table.py [--points 10000:1000 100000:10000] [--repeats 3]
      [--rounds 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
ARMS = ("sharded", "replicated")


def one_arm(arm: str, clients: int, cohort: int, rounds: int) -> dict:
  """In the child process: one arm's rounds after compilation."""
  from fedjax_dp.placement import executor
  from fedjax_dp.placement.host import use_cpu_devices_or_exit
  use_cpu_devices_or_exit()
  if arm == "replicated":
    executor.table_rows = lambda mesh, num_clients: 0
  import jax
  from scaling import point_config
  from fedjax_dp.experiment.checkpoint import state_digest
  from fedjax_dp.experiment.setup import setup
  _, _, sim = setup(point_config(clients, cohort, "stateful"))
  # as `fedjax-dp run` does: the state kept in the rounds' layout from chunk to chunk
  state = sim.to_working(sim.init_state())
  t = time.perf_counter()
  state = jax.block_until_ready(sim.run_working(state, 1)[0])
  compile_s, times = time.perf_counter() - t, []
  for _ in range(rounds):
    t = time.perf_counter()
    state = jax.block_until_ready(sim.run_working(state, 1)[0])
    times.append(time.perf_counter() - t)
  return {"arm": arm, "devices": sim.mesh.devices.size, "compile_s": round(compile_s, 2),
          "median_round_s": statistics.median(times), "digest": state_digest(state.params),
          "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def point(clients: int, cohort: int, repeats: int, rounds: int) -> dict:
  runs = {arm: [] for arm in ARMS}
  for _ in range(repeats):
    for arm in ARMS:
      out = subprocess.run([sys.executable, __file__, "--one", arm, str(clients), str(cohort),
                            "--rounds", str(rounds)], capture_output=True, text=True, check=True)
      runs[arm].append(json.loads(out.stdout.strip().splitlines()[-1]))
  digests = {r["digest"] for arm in ARMS for r in runs[arm]}
  med = {arm: {k: statistics.median(r[k] for r in runs[arm])
               for k in ("median_round_s", "peak_rss_mb")} for arm in ARMS}
  return {"clients": clients, "cohort": cohort, "devices": runs["sharded"][0]["devices"],
          "table_mb": round(clients * _params() * 4 / 2**20), "same_bits": len(digests) == 1,
          **{arm: med[arm] for arm in ARMS},
          "time_ratio": med["sharded"]["median_round_s"] / med["replicated"]["median_round_s"],
          "runs": runs}


def _params() -> int:
  from scaling import PARAMS
  return PARAMS


def _point(text: str) -> tuple[int, int]:
  try:
    clients, cohort = (int(v) for v in text.split(":"))
  except ValueError:
    clients = cohort = 0
  if not 1 <= cohort < clients:
    raise argparse.ArgumentTypeError(
        f"{text!r}: allowed is CLIENTS:COHORT, whole numbers with 1 <= COHORT < CLIENTS "
        "(a partial cohort: with every client, the table is resident)")
  return clients, cohort


def main(argv=None):
  from cli_args import new_file, positive_int, write_results
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--points", nargs="+", type=_point, default=[(10_000, 1_000), (100_000, 10_000)])
  ap.add_argument("--repeats", type=positive_int, default=3)
  ap.add_argument("--rounds", type=positive_int, default=5)
  ap.add_argument("--json", type=new_file)
  ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.one:
    arm, clients, cohort = args.one
    print(json.dumps(one_arm(arm, int(clients), int(cohort), args.rounds)))
    return
  results = []
  for clients, cohort in args.points:
    r = point(clients, cohort, args.repeats, args.rounds)
    results.append(r)
    print(f"{clients:>8} clients, cohort {cohort:>6}, table {r['table_mb']} MB, "
          f"{r['devices']} devices: sharded {r['sharded']['median_round_s']:.4f} s "
          f"{r['sharded']['peak_rss_mb']} MB, replicated {r['replicated']['median_round_s']:.4f} s "
          f"{r['replicated']['peak_rss_mb']} MB, time ratio {r['time_ratio']:.3f}, "
          f"same bits {r['same_bits']}", flush=True)
  if args.json:
    write_results({"points": results}, args.json)


if __name__ == "__main__":
  main()
