"""`fedjax-dp compare RUN_OR_SWEEP ...`: runs side by side, one row each.

A path is a run folder (config.json, metrics.jsonl; summary.json once finished)
or a sweep folder (sweep.json), which stands for each of its cells. A row holds
  run            the folder's name (its path under the sweep for a cell; the path
                 where two names clash)
  <config keys>  every config key whose value differs between the runs
  status         finished, unfinished (no summary.json yet) or diverged
  round          the last evaluated round
  test_<metric>  each test metric at the last evaluation
  best_<metric>  its best over the evaluations (lowest for a loss or an error:
                 LOWER_IS_BETTER; highest for accuracy and any other metric)
  epsilon, epsilon_accountant
                 the run's reported guarantee (summary.json's privacy report; an
                 unfinished run's last row), null without one
  mb_up, mb_down the bytes sent up and down, in MB (1e6 bytes)
  wall_s, s_per_round
                 the run's wall time, and the median seconds per round after
                 compilation (finished runs)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

from fedjax_dp.experiment import reporting
from fedjax_dp.errors import RunError


# test metrics whose best value is the lowest (losses and errors); any other (accuracy,
# a metric of your own task such as f1 or auc) is best at its highest
LOWER_IS_BETTER = ("loss", "mse", "mae", "error")


@dataclasses.dataclass
class RunRecord:
  name: str
  path: str
  config: dict
  rows: list[dict]
  summary: dict | None


def _load_run(path: str, name: str) -> RunRecord:
  cfg_path = os.path.join(path, "config.json")
  try:
    with open(cfg_path) as f:
      config = json.load(f)
  except (OSError, ValueError):
    raise RunError(f"{path}: not a run folder (no readable config.json) and not a sweep "
                   "(no sweep.json)") from None
  summary = None
  if os.path.exists(os.path.join(path, "summary.json")):
    with open(os.path.join(path, "summary.json")) as f:
      summary = json.load(f)
  return RunRecord(name=name, path=path, config=config,
                   rows=reporting.read_metrics(os.path.join(path, "metrics.jsonl")),
                   summary=summary)


def load_runs(paths: list[str]) -> list[RunRecord]:
  """The runs the paths name (a sweep's cells in its order); RunError for a path
  that is neither a run nor a sweep."""
  runs = []
  for path in paths:
    if not os.path.isdir(path):
      raise RunError(f"{path}: no such folder (expected a run folder or a sweep folder)")
    sweep = os.path.join(path, "sweep.json")
    if os.path.exists(sweep):
      with open(sweep) as f:
        cells = [c["name"] for c in json.load(f)["cells"]]
      base = os.path.basename(os.path.normpath(path))
      for cell in cells:
        where = os.path.join(path, "cells", cell)
        if os.path.isdir(where):
          runs.append(_load_run(where, f"{base}/{cell}"))
    else:
      runs.append(_load_run(path, os.path.basename(os.path.normpath(path))))
  if not runs:
    raise RunError(f"{', '.join(paths)}: no runs to compare (a sweep with no cell run yet)")
  names = [r.name for r in runs]
  for r in runs:
    if names.count(r.name) > 1:
      r.name = os.path.normpath(r.path)
  _fill_plugin_defaults(runs)
  return runs


def _unread(run: RunRecord) -> frozenset[str]:
  from fedjax_dp.recipes.config_checks import unread_keys
  from fedjax_dp.experiment.run_folder import saved_config
  return unread_keys(saved_config(os.path.join(run.path, "config.json")))


def differing_keys(runs: list[RunRecord]) -> list[str]:
  """Config keys whose values are not the same in every run (the Config's order),
  but those no run reads (prox_mu of FedAvg runs): as config_diff compares runs."""
  from fedjax_dp.config.schema import _FIELDS
  unread = frozenset.intersection(*(_unread(r) for r in runs))
  order = {k: i for i, k in enumerate(_FIELDS)}   # the Config's order: related keys together
  keys = sorted(dict.fromkeys(k for r in runs for k in r.config),
                key=lambda k: order.get(k, len(order)))
  return [k for k in keys if k not in unread and len(
      {json.dumps(r.config.get(k), sort_keys=True, default=str) for r in runs}) > 1]


def _fill_plugin_defaults(runs: list[RunRecord]) -> None:
  """A plugin's key at its default is not in config.json: the runs that lack a key
  another run sets show its default (their plugins imported for their rows)."""
  from fedjax_dp.config.plugin_keys import PLUGIN_KEYS
  from fedjax_dp.recipes.plugins import load_plugins
  for r in runs:
    load_plugins(tuple(r.config.get("plugins", ())))
  named = {k for r in runs for k in r.config if k in PLUGIN_KEYS}
  for r in runs:
    for k in named - set(r.config):
      r.config[k] = PLUGIN_KEYS[k].default


def shown_config(run: RunRecord) -> dict:
  """The run's config as a row shows it: None for a number nothing in the run reads
  (a FedAvg run's prox_mu); a choice (dp 'none') is always shown."""
  from fedjax_dp.config import CHOICES
  unread = _unread(run)
  return {k: None if k in unread and k not in CHOICES else v for k, v in run.config.items()}


def _best(metric: str, values: list[float]) -> float | None:
  finite = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
  if not finite:
    return None
  return min(finite) if any(w in metric for w in LOWER_IS_BETTER) else max(finite)


def compare_rows(runs: list[RunRecord]) -> list[dict]:
  """One dict a run (see the module docstring), every dict with the same keys."""
  keys = differing_keys(runs)
  out = []
  for r in runs:
    config = shown_config(r)
    last = r.rows[-1] if r.rows else {}
    tests = [k for k in last if k.startswith("test_")]
    privacy = (r.summary or {}).get("privacy", {})
    diverged = (r.summary or {}).get("diverged")
    timing = (r.summary or {}).get("timing", {})
    row = {"run": r.name, **{k: _shown(config.get(k)) for k in keys},
           "status": "diverged" if diverged else "finished" if r.summary else "unfinished",
           "round": last.get("round"),
           **{k: last.get(k) for k in tests},
           **{f"best_{k[len('test_'):]}": _best(k, [x.get(k) for x in r.rows]) for k in tests},
           "epsilon": privacy.get("epsilon") if r.summary else last.get("epsilon"),
           "epsilon_accountant": (privacy.get("epsilon_accountant") if r.summary
                                  else last.get("epsilon_accountant")),
           "mb_up": _mb(last.get("bytes_up")), "mb_down": _mb(last.get("bytes_down")),
           "wall_s": timing.get("wall_s", last.get("wall_s")),
           "s_per_round": timing.get("seconds_per_round_median")}
    out.append(row)
  columns = list(dict.fromkeys(k for row in out for k in row))
  return [{k: row.get(k) for k in columns} for row in out]


def _shown(value):
  return ",".join(map(str, value)) if isinstance(value, list) else value


def _mb(value):
  return None if value is None else value / 1e6


def sort_rows(rows: list[dict], key: str | None) -> list[dict]:
  """Rows sorted by column `key` ('-key': descending); nulls last. RunError for an
  unknown column."""
  if not key:
    return rows
  name, descending = (key[1:], True) if key.startswith("-") else (key, False)
  if rows and name not in rows[0]:
    raise RunError(f"--sort {key}: no column {name!r}; columns are {', '.join(rows[0])}")
  present = [r for r in rows if r[name] is not None]
  return sorted(present, key=lambda r: r[name], reverse=descending) + [
      r for r in rows if r[name] is None]


def format_table(rows: list[dict]) -> str:
  """Rows as an aligned text table (numbers right-aligned, 4 significant digits)."""
  def cell(v):
    if v is None:
      return "-"
    if isinstance(v, float):
      return f"{v:.4g}" if abs(v) < 1e6 else f"{v:.3e}"
    return str(v)
  columns = list(rows[0])
  text = [[cell(r[c]) for c in columns] for r in rows]
  widths = [max(len(c), *(len(t[i]) for t in text)) for i, c in enumerate(columns)]
  numeric = [all(isinstance(r[c], (int, float)) or r[c] is None for r in rows)
             for c in columns]
  line = lambda vals: "  ".join(v.rjust(w) if num else v.ljust(w)
                                for v, w, num in zip(vals, widths, numeric)).rstrip()
  return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(t) for t in text])


def plot_runs(runs: list[RunRecord], path: str) -> str:
  """The first test metric (and epsilon, where any run accounts one) against rounds,
  one line per run, in one PNG."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  metric = next((k for r in runs for row in r.rows[:1] for k in row if k.startswith("test_")),
                "test_accuracy")
  panels = [metric] + (["epsilon"] if any(row.get("epsilon") is not None for r in runs
                                           for row in r.rows) else [])
  fig, axes = plt.subplots(1, len(panels), figsize=(6.0 * len(panels), 4.0), dpi=120,
                           squeeze=False)
  colors = plt.get_cmap("tab10" if len(runs) <= 10 else "tab20").colors
  for ax, key in zip(axes[0], panels):
    ax.set_prop_cycle(color=[colors[i % len(colors)] for i in range(len(runs))])
    for r in runs:
      pts = [(row["round"], row[key]) for row in r.rows if row.get(key) is not None]
      if pts:
        ax.plot(*zip(*pts), marker="." if len(pts) < 50 else None, label=r.name)
    ax.set_xlabel("round")
    ax.set_ylabel(key.replace("_", " "))
    ax.grid(alpha=0.3)
  axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  reporting.save_figure_atomic(fig, path)
  plt.close(fig)
  return path


def compare(*paths: str) -> list[dict]:
  """The rows of `fedjax-dp compare` for run and sweep folders (Python API)."""
  return compare_rows(load_runs(list(paths)))
