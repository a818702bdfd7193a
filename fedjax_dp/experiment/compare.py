"""`fedjax-dp compare RUN_OR_SWEEP ...`: runs side by side, one row each.

A path is a run folder (config.json, metrics.jsonl; summary.json once finished)
or a sweep folder (sweep.json), which stands for each of its cells. A row holds
  run            the folder's name (its path under the sweep for a cell; the path
                 where two names clash)
  <config keys>  every config key whose value differs between the runs
  status         finished, budget (stopped by its privacy budget before its rounds),
                 unfinished (no summary.json yet) or diverged
  round          the last evaluated round
  test_<metric>  each test metric at the last evaluation
  best_<metric>  its best over the evaluations (lowest for a loss or an error:
                 LOWER_IS_BETTER; highest for accuracy and any other metric)
  epsilon, guarantee, epsilon_accountant
                 the run's reported guarantee (summary.json's privacy report; an
                 unfinished run's last row), null without one, and whom it protects
                 (the neighbouring relation: epsilons of different relations answer
                 different questions and are not comparable)
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
  setting: str | None = None   # a sweep cell's setting (its name but the seed): plotted
                               # as the mean over its seeds


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
        cells = json.load(f)["cells"]
      base = os.path.basename(os.path.normpath(path))
      for cell in cells:
        where = os.path.join(path, "cells", cell["name"])
        if os.path.isdir(where):
          run = _load_run(where, f"{base}/{cell['name']}")
          run.setting = os.path.join(os.path.normpath(path), ",".join(
              f"{k}={v}" for k, v in cell["values"].items() if k != "seed") or "base")
          runs.append(run)
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
  """The keys nothing in the run reads; none where its config cannot be resolved in
  this process (a rule registered from the user's own code): compare only reads."""
  from fedjax_dp.recipes.config_checks import unread_keys
  from fedjax_dp.experiment.run_folder import saved_config
  try:
    return unread_keys(saved_config(os.path.join(run.path, "config.json"), "fedjax-dp compare"))
  except RunError:
    return frozenset()


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
    epsilon = privacy.get("epsilon") if r.summary else last.get("epsilon")
    row = {"run": r.name, **{k: _shown(config.get(k)) for k in keys},
           "status": _status(r.summary, privacy, diverged),
           "round": last.get("round"),
           **{k: last.get(k) for k in tests},
           **{f"best_{k[len('test_'):]}": _best(k, [x.get(k) for x in r.rows]) for k in tests},
           "epsilon": epsilon,
           "guarantee": _guarantee(privacy, r.config) if epsilon is not None else None,
           "epsilon_accountant": (privacy.get("epsilon_accountant") if r.summary
                                  else last.get("epsilon_accountant")),
           "mb_up": _mb(last.get("bytes_up")), "mb_down": _mb(last.get("bytes_down")),
           "wall_s": timing.get("wall_s", last.get("wall_s")),
           "s_per_round": timing.get("seconds_per_round_median")}
    out.append(row)
  columns = list(dict.fromkeys(k for row in out for k in row))
  return [{k: row.get(k) for k in columns} for row in out]


def _status(summary: dict | None, privacy: dict, diverged) -> str:
  if diverged:
    return "diverged"
  if summary is None:
    return "unfinished"
  return "budget" if privacy.get("stopped_by_budget") is True else "finished"


def _guarantee(privacy: dict, config: dict) -> str | None:
  """Whom a run's epsilon protects, short: 'add/remove one client', 'replace one
  client', local DP's 'replace one client's data, largest client', kept noise's
  'replace one client's data, per client'; an unfinished run's from its config."""
  if (privacy.get("kept_noise") or {}).get("accountant", {}).get("complete"):
    return "replace one client's data, per client"
  relation, largest = privacy.get("neighbouring"), privacy.get("epsilon_is")
  if not relation:   # no summary yet: what the config's mechanism describes
    from fedjax_dp.privacy.mechanisms import get_mechanism
    from fedjax_dp.privacy.mechanisms.base import CohortSampling
    try:
      m = get_mechanism(config["dp"])
      relation = m.describe(CohortSampling(config["sampling"], config["clients_per_round"],
                                           config["num_clients"]))["neighbouring"]
      largest = "the largest client's" if m.per_client_ledgers else None
    except Exception:   # a mechanism this process has not registered: compare only reads
      return None
  return relation.split(" (")[0] + (", largest client" if largest == "the largest client's"
                                    else "")


def select_columns(rows: list[dict], columns: str | None) -> list[dict]:
  """Rows with only `columns` (comma-separated; the run's name always first); RunError
  naming an unknown column and the columns there are."""
  if not columns:
    return rows
  wanted = [c.strip() for c in columns.split(",") if c.strip()]
  known = list(rows[0]) if rows else []
  for c in wanted:
    if c not in known:
      raise RunError(f"--columns {columns}: no column {c!r}; columns are {', '.join(known)}")
  keep = ["run"] + [c for c in wanted if c != "run"]
  return [{c: r[c] for c in keep} for r in rows]


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


def _curves(runs: list[RunRecord], key: str) -> list[tuple[str, list, list, list | None]]:
  """(label, rounds, values, sd or None) per line: a run's own curve, or a sweep
  setting's mean over its seeds with their sd (at the rounds every seed evaluated)."""
  groups: dict[str, list[RunRecord]] = {}
  for r in runs:
    groups.setdefault(r.setting or f"\0{r.name}", []).append(r)
  out = []
  names = _setting_names(list(groups))
  for setting, members in groups.items():
    series = [{row["round"]: row[key] for row in r.rows if row.get(key) is not None}
              for r in members]
    rounds = sorted(set.intersection(*(set(s) for s in series))) if series else []
    if not rounds:
      continue
    if len(members) == 1:
      out.append((members[0].name, rounds, [series[0][t] for t in rounds], None))
      continue
    import numpy as np
    values = np.array([[s[t] for t in rounds] for s in series], np.float64)
    if key == "epsilon":   # each seed is a release of its own: the largest, never a mean
      out.append((f"{names[setting]} (largest of {len(members)} seeds)", rounds,
                  values.max(0).tolist(), None))
      continue
    out.append((f"{names[setting]} (mean of {len(members)} seeds)", rounds,
                values.mean(0).tolist(), values.std(0, ddof=1).tolist()))
  return out


def _setting_names(settings: list[str]) -> dict[str, str]:
  """A sweep setting's label: its sweep folder's name and its values, or its path where
  two sweeps of one name are compared."""
  short = {s: os.path.join(os.path.basename(os.path.dirname(s)), os.path.basename(s))
           for s in settings}
  clash = {v for v in short.values() if list(short.values()).count(v) > 1}
  return {s: s if short[s] in clash else short[s] for s in settings}


def plot_runs(runs: list[RunRecord], path: str) -> str:
  """The first test metric (and epsilon, where any run accounts one) against rounds,
  one line per run (a sweep's seeds as their mean +- sd), in one PNG."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.ticker import MaxNLocator
  metric = next((k for r in runs for row in r.rows[:1] for k in row if k.startswith("test_")),
                "test_accuracy")
  panels = [metric] + (["epsilon"] if any(row.get("epsilon") is not None for r in runs
                                           for row in r.rows) else [])
  lines = {key: _curves(runs, key) for key in panels}
  count = max(len(v) for v in lines.values())
  fig, axes = plt.subplots(1, len(panels), figsize=(6.0 * len(panels) + (3.0 if count > 6
                                                                         else 0), 4.0),
                           dpi=120, squeeze=False)
  colors = plt.get_cmap("tab10" if count <= 10 else "tab20").colors
  labels = list(dict.fromkeys(label for key in panels for label, *_ in lines[key]))
  color_of = {label: colors[i % len(colors)] for i, label in enumerate(labels)}  # one per run
  for ax, key in zip(axes[0], panels):
    for label, rounds, values, sd in lines[key]:
      color = color_of[label]
      ax.plot(rounds, values, color=color, marker="." if len(rounds) < 50 else None,
              label=label)
      if sd is not None:
        lo = [v - e for v, e in zip(values, sd)]
        hi = [v + e for v, e in zip(values, sd)]
        ax.fill_between(rounds, lo, hi, color=color, alpha=0.2, linewidth=0)
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(key.replace("_", " "))
    ax.set_title(f"{key.replace('_', ' ')} of {len(runs)} runs")
    ax.grid(alpha=0.3)
  if count > 6:   # beside the axes, not over the curves
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
  else:
    axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  reporting.save_figure_atomic(fig, path)
  plt.close(fig)
  return path


def compare(*paths: str) -> list[dict]:
  """The rows of `fedjax-dp compare` for run and sweep folders (Python API)."""
  return compare_rows(load_runs(list(paths)))
