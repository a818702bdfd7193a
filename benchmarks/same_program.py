"""Whether two source trees compile the same round: a refactor's speed check that
needs no timing.

For each config below, in a fresh process per tree, builds the simulation, lowers
and compiles one chunk of rounds (`Simulation.run_chunk`) and hashes XLA's
optimised program text with what does not compute taken out (the debug tables of
source files and lines, instruction metadata, the entry's parameter names, which
follow the state's field names). Equal hashes mean the two trees run the same compiled program: the same
speed, whatever the machine's noise, so the refactor changed nothing of the round's
cost. Unequal hashes say only that something differs: then time them side by
side (benchmarks/before_after.py).

  git archive REV fedjax_dp kernels benchmarks | tar -x -C .bench/before   (and after)
  python benchmarks/same_program.py .bench/before .bench/after [--json OUT]

Each tree needs its `fedjax_dp/kernels` link to `kernels/` (made here if missing).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from cli_args import new_file

CONFIGS = {
    "fedavg": {},
    "central_dp_adaptive": {"dp": "central", "noise_multiplier": 1.0, "adaptive_clipping": True},
    "local_dp": {"dp": "local", "noise_multiplier": 1.0},
    "local_dp_budgets": {"dp": "local", "noise_multiplier": 1.0, "target_epsilon": 50.0},
    "topksdp": {"algorithm": "topksdp"},
    "krum_byzantine": {"aggregator": "krum", "byzantine_fraction": 0.2},
    "audit_canaries": {"dp": "central", "noise_multiplier": 1.0, "audit_canaries": 2},
    "one_step": {"local_epochs": 1, "batch_size": 1000},
    "cluster": {"aggregator": "cluster"},
    "cluster_noise": {"dp": "local", "noise_multiplier": 0.5, "aggregator": "cluster",
                      "cluster_noise": "equalize"},
    "server_clip": {"byzantine_fraction": 0.2, "server_clip_l2": 1.0},
    "kept_noise_paper": {"algorithm": "topksdp", "s_local": 0.9, "coordinate_clip": 0.05,
                         "kept_noise": "paper", "ldp_epsilon": 3.0, "kept_noise_draw": "client"},
    "kept_noise_multiplier": {"algorithm": "topksdp", "s_local": 0.9, "final_clip_l2": 0.5,
                              "index_selection": "random_k", "kept_noise": "multiplier",
                              "kept_noise_multiplier": 2.0},
    # correlated noise (issue 42): the tree and BandMF on a cyclic schedule
    "tree_cyclic": {"dp": "tree", "sampling": "cyclic", "noise_multiplier": 1.0},
    "bandmf_cyclic": {"dp": "bandmf", "sampling": "cyclic", "noise_multiplier": 1.0},
}
BASE = {"dataset": "digits", "num_clients": 20, "clients_per_round": 10, "hidden": [32],
        "rounds": 4, "devices": 1}

CHILD = r"""
import hashlib, json, re, sys
import fedjax_dp
from fedjax_dp.experiment.setup import setup
values = json.loads(sys.argv[1])
_, _, sim = setup(fedjax_dp.make_config(values))
state = sim.to_working(sim.init_state())
text = sim.run_chunk.lower(state, sim.store, sim.hparams, 2).compile().as_text()
# what does not change the computation: the debug tables (source files, functions,
# locations, stack frames), each instruction's metadata, the module's name line and
# the entry's parameter names (from the state's pytree paths), numbered instead
text = re.sub(r"^(FileNames|FunctionNames|FileLocations|StackFrames)\n.*?\n\n", "", text,
              flags=re.S | re.M)
text = re.sub(r", metadata=\{[^}]*\}", "", text)
text = re.sub(r",? ?stack_frame_id=\d+", "", text)
text = re.sub(r"^HloModule [^\n]*", "HloModule", text, flags=re.M)
entry = re.search(r"^ENTRY %\S+ \((.*)\) -> ", text, flags=re.M).group(1)
names = re.findall(r"([\w.]+): ", entry)
for i, name in enumerate(names):
  text = re.sub(r"(?<![\w.])%?" + re.escape(name) + r"(?![\w.])", f"entry_arg_{i}", text)
print(json.dumps({"sha256": hashlib.sha256(text.encode()).hexdigest(), "lines": text.count("\n"),
                  "parallelism": sim.client_parallelism}))
"""


def program(tree: str, values: dict) -> dict:
  """The hash of the compiled chunk `tree` builds for `values`, from a fresh process."""
  link = os.path.join(tree, "fedjax_dp", "kernels")
  if not os.path.exists(link):
    os.symlink(os.path.abspath(os.path.join(tree, "kernels")), link)
  env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), FEDJAX_DP_CPU_DEVICES="1")
  env.pop("XLA_FLAGS", None)
  out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(values)], env=env,
                       capture_output=True, text=True, check=True, cwd=tree)
  return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("before")
  parser.add_argument("after")
  parser.add_argument("--json", type=new_file, help="write the table here too (a new file)")
  parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS),
                      help="compare only these (default: all)")
  args = parser.parse_args(argv)
  rows = {}
  for name in args.configs:
    values = CONFIGS[name]
    before, after = (program(t, {**BASE, **values}) for t in (args.before, args.after))
    rows[name] = {"before": before, "after": after, "same": before["sha256"] == after["sha256"]}
    print(f"{name:22s} {'same' if rows[name]['same'] else 'DIFFERENT':9s} "
          f"{before['sha256'][:12]} {after['sha256'][:12]} ({after['lines']} lines, "
          f"{after['parallelism']})", flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)
  return 0 if all(r["same"] for r in rows.values()) else 1


if __name__ == "__main__":
  sys.exit(main())
