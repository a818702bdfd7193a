"""A partial cohort's per-client table, sharded over the devices against replicated.

With a cohort drawn each round, a stage's per-client state (SCAFFOLD's control
variates here) lives in a [clients, d] table. It used to be replicated on every
device; it is now sharded in blocks of client ids (placement/executor.py,
`table_rows`), every slot's row fetched in one exchange before the client loop.
This measures both on scaling.py's stateful protocol (synthetic data, MLP
32-64-10, 2 examples a client, SCAFFOLD, a fixed cohort):

  time     both arms built in one process and their rounds interleaved (`--rounds`
           each, after compilation), so both see the same machine; the ratio of
           their medians, the median over `--repeats` such processes
  memory   each arm in a process of its own: XLA's memory analysis of the
           compiled round on one device (its arguments, the table's share among
           them, and its temporaries), and the process's resident memory after
           the rounds and at its peak (the peak includes the start, where the
           table in client order is replicated on every device)

Both arms must release the same bits (checked on the final models' digests).

  python benchmarks/sharded_table.py [--points 10000:1000 100000:10000] [--repeats 3]
      [--rounds 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import gc
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


def _build(arm: str, clients: int, cohort: int):
  """The arm's Simulation and its round-0 state in the rounds' layout (as `fedjax-dp
  run` keeps it from chunk to chunk); the replicated arm is the table before b8cd2c2."""
  from fedjax_dp.placement import executor
  sharded = executor.table_rows
  if arm == "replicated":
    executor.table_rows = lambda mesh, num_clients: 0
  try:
    from scaling import point_config
    from fedjax_dp.experiment.setup import setup
    _, _, sim = setup(point_config(clients, cohort, "stateful"))
  finally:
    executor.table_rows = sharded
  return sim, sim.to_working(sim.init_state())


def _round(sim, state):
  import jax
  t = time.perf_counter()
  state = jax.block_until_ready(sim.run_working(state, 1)[0])
  return state, time.perf_counter() - t


def timing(clients: int, cohort: int, rounds: int) -> dict:
  """In a child process: both arms built, then their rounds interleaved (a round of
  one, a round of the other), so that both see the same machine; medians."""
  from fedjax_dp.experiment.checkpoint import state_digest
  arms = {arm: list(_build(arm, clients, cohort)) for arm in ARMS}
  for v in arms.values():            # compilation
    v[1] = _round(*v)[0]
  times = {arm: [] for arm in ARMS}
  for _ in range(rounds):
    for arm, v in arms.items():
      v[1], t = _round(*v)
      times[arm].append(t)
  med = {arm: statistics.median(ts) for arm, ts in times.items()}
  return {**{f"{arm}_round_s": med[arm] for arm in ARMS},
          "ratio": med["sharded"] / med["replicated"],
          "digests": [state_digest(v[1].params) for v in arms.values()]}


def memory(arm: str, clients: int, cohort: int, rounds: int) -> dict:
  """In a child process of its own (its resident memory is the arm's): XLA's memory
  analysis of the compiled round on one device (its arguments, the table's share
  among them, and its temporaries), and the process's resident memory after
  `rounds` rounds and at its peak."""
  sim, state = _build(arm, clients, cohort)
  for _ in range(rounds):
    state = _round(sim, state)[0]
  mem = sim.run_chunk.lower(state, sim.store, sim.hparams, 1).compile().memory_analysis()
  gc.collect()
  return {"arm": arm, "devices": sim.mesh.devices.size,
          "round_arguments_mb": mem.argument_size_in_bytes / 2**20,
          "round_temp_mb": mem.temp_size_in_bytes / 2**20, "rss_after_mb": _rss_mb(),
          "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _rss_mb() -> float:
  """This process's resident memory now (the peak includes the start's client-order
  table, replicated on every device for a moment)."""
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _child(*args: str) -> dict:
  out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                       check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def point(clients: int, cohort: int, repeats: int, rounds: int) -> dict:
  where = [str(clients), str(cohort), "--rounds", str(rounds)]
  timed = [_child("--timing", *where) for _ in range(repeats)]
  mem = {arm: _child("--memory", arm, *where) for arm in ARMS}
  return {"clients": clients, "cohort": cohort, "devices": mem["sharded"]["devices"],
          "table_mb": round(clients * _params() * 4 / 2**20),
          "same_bits": len({d for t in timed for d in t["digests"]}) == 1,
          "time_ratio": statistics.median(t["ratio"] for t in timed),
          **{f"{arm}_round_s": statistics.median(t[f"{arm}_round_s"] for t in timed)
             for arm in ARMS},
          "memory": mem, "timings": timed}


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
  ap.add_argument("--timing", nargs=2, help=argparse.SUPPRESS)
  ap.add_argument("--memory", nargs=3, help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.timing or args.memory:
    from fedjax_dp.placement.host import use_cpu_devices_or_exit
    use_cpu_devices_or_exit()
    print(json.dumps(timing(*map(int, args.timing), args.rounds) if args.timing else
                     memory(args.memory[0], *map(int, args.memory[1:]), args.rounds)))
    return
  results = []
  for clients, cohort in args.points:
    r = point(clients, cohort, args.repeats, args.rounds)
    results.append(r)
    print(f"{clients:>8} clients, cohort {cohort:>6}, table {r['table_mb']} MB, "
          f"{r['devices']} devices: sharded / replicated {r['time_ratio']:.3f} (median of "
          f"{args.repeats}), same bits {r['same_bits']}", flush=True)
    for arm in ARMS:
      m = r["memory"][arm]
      print(f"  {arm:>10}: {r[arm + '_round_s']:.4f} s a round; the round's arguments "
            f"{m['round_arguments_mb']:.0f} MB + temporaries {m['round_temp_mb']:.0f} MB a "
            f"device; RSS after the rounds {m['rss_after_mb']:.0f} MB, peak "
            f"{m['peak_rss_mb']:.0f} MB", flush=True)
  if args.json:
    write_results({"command": " ".join(sys.argv), "points": results}, args.json)


if __name__ == "__main__":
  main()
