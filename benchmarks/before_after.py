"""The round benchmarks of two source trees side by side, in one invocation.

A refactor must not slow the round (issue 40, item 7: within 3 % of the commit
before). This runs `fedavg_round.py`, `topksdp_round.py` and `cross_device.py` from
each tree in turn, before, after, before, after, ..., each in a fresh process on the
same machine, and reports each benchmark's median seconds per round for both trees
and their ratio (after / before: the median over the repeats of the ratio of
neighbouring runs, which follows the machine's drift).

  git archive REV fedjax_dp kernels benchmarks | tar -x -C .bench/before   (and after)
  python benchmarks/before_after.py .bench/before .bench/after [--repeats 3] [--json OUT]

Each tree needs its `fedjax_dp/kernels` link to `kernels/` (made here if missing) and
the Fashion-MNIST files (FEDJAX_DP_DATA or the usual places).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from cli_args import new_file

# name -> (script and arguments, the JSON's seconds per round)
BENCHMARKS = {
    "fedavg_round": (["fedavg_round.py", "--rounds", "15"],
                     lambda r: r["fedjax_median_round_s"]),
    "topksdp_round": (["topksdp_round.py", "--chunks", "5", "--only", "topksdp",
                       "--no-kernels"],
                      lambda r: r["rounds"]["seconds_per_round_median"]["topksdp"]),
    "cross_device_10000x6": (["cross_device.py", "--protocol", "10000x6", "--rounds", "9"],
                             lambda r: _cross(r, "10000x6")),
    "cross_device_100x600": (["cross_device.py", "--protocol", "100x600", "--rounds", "9"],
                             lambda r: _cross(r, "100x600")),
}


def _cross(result: dict, protocol: str) -> float:
  """The median round of `protocol` (client_parallelism auto) in cross_device.py's JSON."""
  return result["runs"][f"{protocol}/auto"]["median_round_s"]


def run_one(tree: str, name: str, limit: int) -> float | str:
  """One benchmark of `tree` in a fresh process: its seconds per round, or why not."""
  script, seconds = BENCHMARKS[name]
  link = os.path.join(tree, "fedjax_dp", "kernels")
  if not os.path.lexists(link):
    os.symlink("../kernels", link)
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "result.json")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.abspath(tree)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                   if p]))
    cmd = [sys.executable, os.path.join("benchmarks", script[0]), *script[1:], "--json", out]
    try:
      done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True,
                            timeout=limit)
    except subprocess.TimeoutExpired:
      return f"timed out after {limit} s"
    if done.returncode != 0:
      return f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"
    with open(out) as f:
      return seconds(json.load(f))


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("before")
  ap.add_argument("after")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--only", nargs="+", choices=list(BENCHMARKS), default=list(BENCHMARKS))
  ap.add_argument("--limit", type=int, default=300, help="seconds per benchmark process")
  ap.add_argument("--json", default=None, type=new_file)
  args = ap.parse_args(argv)
  times = {name: {"before": [], "after": []} for name in args.only}
  for i in range(args.repeats):
    for name in args.only:
      for side in ("before", "after"):
        got = run_one(getattr(args, side), name, args.limit)
        print(f"{name} {side} {i}: {got}", flush=True)
        if isinstance(got, float):
          times[name][side].append(got)
  summary = {}
  for name, t in times.items():
    pairs = [a / b for a, b in zip(t["after"], t["before"])]
    summary[name] = {"before_s": t["before"], "after_s": t["after"],
                     "ratio_after_over_before": statistics.median(pairs) if pairs else None}
  print(json.dumps(summary, indent=2))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(summary, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
