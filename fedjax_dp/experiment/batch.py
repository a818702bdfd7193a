"""Many runs into one folder tree (the experiment scripts, later the sweep command):
the whole request checked before the first run, and a tree that belongs to one
experiment and one dataset.

A script that runs for hours must not fail at its seventeenth run for a reason it
could have seen at the start: every run's config is built (and checked) first,
each run folder already there is compared with the run asked for, and the data
must be available. The tree's `experiment.json` names what it holds, so that
`--dataset mnist` never writes into a Fashion-MNIST tree.
"""

from __future__ import annotations

import json
import os

from fedjax_dp.config import Config
from fedjax_dp.experiment import reporting
from fedjax_dp.errors import RunError
from fedjax_dp.experiment.run_folder import make_out_folder

OWNER = "experiment.json"


def claim_tree(root: str, owner: dict) -> None:
  """Makes `root` (a new or empty folder, or one this experiment made) and records
  `owner` ({'experiment': ..., 'dataset': ...}) in root/experiment.json; a tree that
  holds another experiment or dataset is a RunError naming both."""
  path = os.path.join(root, OWNER)
  if os.path.isfile(path):
    with open(path) as f:
      held = json.load(f)
    if held != owner:
      differ = ", ".join(f"{k} {held.get(k)!r} there, {owner.get(k)!r} asked"
                         for k in sorted(set(held) | set(owner)) if held.get(k) != owner.get(k))
      raise RunError(f"{root} holds another experiment's results ({differ}): choose another "
                     "--out (the default is one folder per dataset)")
    return
  if os.path.isdir(root) and os.listdir(root):
    raise RunError(f"{root} is not empty and holds no {OWNER}: choose an empty or new --out")
  make_out_folder(root)
  reporting.write_json_atomic(path, owner)


def check_request(cells: list[tuple[str, Config]], overwrite: bool) -> None:
  """Before the first run: each run folder of `cells` [(out, cfg)] that exists holds
  the same run (or `overwrite`), and each dataset is available here. RunError,
  nothing run or written, naming the first problem."""
  from fedjax_dp.data.registry import find_dataset
  from fedjax_dp.experiment.runner import reuse_conflict
  for out, cfg in cells:
    problem = reuse_conflict(cfg, out, overwrite)
    if problem:
      raise RunError(f"{problem} (found before any run: nothing was run)")
  for dataset, data_dir in sorted({(c.dataset, c.data_dir) for _, c in cells
                                   if c.dataset != "custom"},   # your own data: passed in
                                  key=lambda d: (d[0], d[1] or "")):
    found, where = find_dataset(dataset, data_dir)
    if not found:
      raise RunError(f"dataset {dataset!r} is not available: {where} (found before any run: "
                     "nothing was run)")


def add_tree_arguments(ap, default_out: str | None, layout: str, committed: str,
                       shown_default: str | None = None) -> None:
  """An experiment script's --out (its results tree: `layout`) and --overwrite;
  `shown_default` where the default is worked out later (default_out None)."""
  ap.add_argument("--out", default=default_out,
                  help=f"the results tree, {layout} (default {shown_default or default_out}; "
                       f"the committed results are {committed})")
  ap.add_argument("--overwrite", action="store_true",
                  help="rerun the runs under --out whose settings differ (else an error)")


def check_distinct(ap, args, names: tuple[str, ...]) -> None:
  """ap.error (one line, exit 2) where a list option repeats a value."""
  for name in names:
    values = getattr(args, name)
    if len(set(values)) < len(values):
      ap.error(f"--{name.replace('_', '-')} {' '.join(map(str, values))}: each value at most once")
