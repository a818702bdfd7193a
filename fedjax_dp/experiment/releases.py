"""The release registry: everything a run, sweep, audit, attack, compare or profile can
publish, declared once with its privacy status (the tables: release_registry.py).

`declaration(name, cfg)` looks a name up (None: undeclared, which tests/test_releases.py
refuses for every output of a generated grid of runs); `not_accounted(cfg, written)` is
the report's list for what a run wrote; `markdown()` is the README's table.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import re
from typing import Iterable

from fedjax_dp.privacy.mechanisms import KEPT_NOISE, MECHANISMS, get_mechanism, kept_noise
from fedjax_dp.recipes.flat import kept_noise_of
from fedjax_dp.experiment.release_registry import (  # noqa: F401  (the registry's names, here too)
    _CONDITIONS, COVERED, FIGURES, INFLUENCES, NOT_COVERED, OTHER_FILES, PLOT_FIGURES, PUBLIC,
    RUN_FILES, SUMMARY, TABLE_COLUMNS, Declared, Status, bundle_rows)


# ------------------------------------------------------------------ lookup


def figure(key: str, cfg) -> Declared | None:
  """A metrics row figure's declaration (None: undeclared): a FIGURES entry, or a
  stage's own metric '<stage>.<metric>' (stage_figure; no built-in figure has a dot)."""
  for pattern, (status, says) in FIGURES.items():
    if fnmatch.fnmatchcase(key, pattern):
      return Declared(status(cfg) if callable(status) else status, says)
  return stage_figure(key, cfg) if "." in key else None


UNDECLARED_STAGE_METRIC = ("a stage's own figure that no stage of this run declares: taken as "
                           "computed from the clients' data without noise")


def stage_figure(key: str, cfg, undeclared: bool = True) -> Declared | None:
  """'<stage>.<metric>' (the only row figures with a dot: the callbacks write a stage's
  metrics so): as the run's stage declares it (`declares`: ((metric, status, says),
  ...)), else not covered; `undeclared` False: None instead of that default."""
  stage, _, metric = key.partition(".")
  found = _stage_declarations(cfg).get(stage, {}).get(metric)
  if found is not None:
    return Declared(*found)
  return Declared(NOT_COVERED, UNDECLARED_STAGE_METRIC) if undeclared else None


def _stage_declarations(cfg) -> dict[str, dict[str, tuple[str, str]]]:
  """{stage name: {metric: (status, says)}} of the stages of cfg's recipe that can
  report metrics: the upload pipeline's, the aggregation rule's (as 'aggregator')
  and the server's (built, as the round names their slots). Read afresh each time
  (only dotted names ask): a cache keyed on the config would outlive a registry."""
  from fedjax_dp.recipes.flat import from_config
  recipe = from_config(cfg)
  stages = [(c.stage.name, c.stage.declares) for c in recipe.upload]
  stages.append(("aggregator", recipe.rule.declares))
  for c in recipe.server:
    built = c.stage.build(cfg.num_clients, 0)
    stages.append((built.name, built.declares))
  return {name: {m: (status, says) for m, status, says in declares}
          for name, declares in stages}


def _match(path: str, patterns: dict) -> tuple | None:
  """The first pattern of `patterns` that matches the dotted `path` ('*' one segment,
  '**' any rest), in declaration order (specific entries come first)."""
  for pattern, value in patterns.items():
    if _regex(pattern).fullmatch(path):
      return value
  return None


@functools.lru_cache(maxsize=None)
def _regex(pattern: str) -> re.Pattern:
  """'**' a whole segment: any rest (one or more segments); '*' within a segment: any
  characters but a dot."""
  return re.compile(r"\.".join(".+" if seg == "**" else re.escape(seg).replace(r"\*", "[^.]*")
                                for seg in pattern.split(".")))


def _declared(value, cfg) -> Declared:
  status, says = value
  return Declared(status(cfg) if callable(status) else status, says)


def declaration(name: str, cfg) -> Declared | None:
  """The declaration of a published `name` ('file', 'file:key', or for the other
  commands 'command:file[:key]'), for a run of `cfg`; None: undeclared."""
  if name.startswith(tuple(c + ":" for c in ("sweep", "audit", "attack", "compare",
                                            "profile", "account", "datasets"))):
    return _other(name, cfg)
  file, _, key = name.partition(":")
  if not key:
    if file in RUN_FILES:
      return _declared(RUN_FILES[file], cfg)
    return _plot(file, cfg)
  if file in ("metrics.jsonl", "metrics.csv", "tensorboard/"):
    return figure(key, cfg)
  if file == "summary.json":
    if key.startswith("final."):
      return figure(key[len("final."):], cfg)
    value = _match(key, bundle_rows(cfg)) or _match(key, SUMMARY)
    return _declared(value, cfg) if value else None
  return None


def _plot(file: str, cfg) -> Declared | None:
  """A run's plot, declared by the figures it shows (the worst first)."""
  if not file.endswith(".png"):
    return None
  keys = PLOT_FIGURES.get(file, (f"test_{file[:-len('.png')]}",))
  found = [figure(k, cfg) for k in keys]
  if None in found:
    return None
  worst = next((d for d in found if d.status == NOT_COVERED), found[0])
  return Declared(worst.status, f"plots {', '.join(keys)}: {worst.says}")


def _other(name: str, cfg) -> Declared | None:
  command, _, rest = name.partition(":")
  file, _, key = rest.partition(":")
  if command == "sweep" and file == "cells/" and key:
    return declaration(key, cfg)   # a cell's own output
  if command == "audit" and file == "run/" and key:
    return declaration(key, cfg)
  if key and file in ("results.csv", "results.parquet", "final.csv", "table.csv"):
    return _column(key, cfg)
  value = OTHER_FILES.get(f"{command}:{file}:{key}" if key else f"{command}:{file}")
  if value is None and key:
    value = _match(key, {k.split(":", 2)[2]: v for k, v in OTHER_FILES.items()
                         if k.startswith(f"{command}:{file}:")})
  if value is None and not key and command == "sweep" and file.endswith(".png"):
    return _sweep_plot(file, cfg)
  return _declared(value, cfg) if value else None


def _sweep_plot(file: str, cfg) -> Declared | None:
  """A sweep's plot of one figure's mean and sd over seeds: loss.png is test_loss's,
  train_loss.png and epsilon.png their figures', <metric>.png test_<metric>'s."""
  name = file[:-len(".png")]
  found = figure("test_loss" if name == "loss" else name, cfg) or figure(f"test_{name}", cfg)
  return found and Declared(found.status, f"mean and sd over seeds: {found.says}")


def _column(key: str, cfg) -> Declared | None:
  """A sweep table's or compare's column: a setting (a config key: public), its own
  column, or a row figure (final.csv: with _mean, _sd or _seeds; compare: best_*)."""
  from fedjax_dp.config import Config
  if key == "seed":
    return _declared(RUN_FILES["config.json"], cfg)
  from fedjax_dp.config.plugin_keys import PLUGIN_KEYS
  if key in Config.__dataclass_fields__ or key in PLUGIN_KEYS:
    return Declared(PUBLIC, "a setting")
  if key in TABLE_COLUMNS:
    return _declared(TABLE_COLUMNS[key], cfg)
  declared = stage_figure(key, cfg, undeclared=False) if "." in key else None
  if declared is not None:   # a stage's metric named like a final table's column
    return declared
  for suffix in ("_mean", "_sd", "_seeds"):
    if key.endswith(suffix):
      return figure(key[:-len(suffix)], cfg)
  return figure("test_" + key[len("best_"):], cfg) if key.startswith("best_") else figure(
      key, cfg)


# ------------------------------------------------------------------ what a run wrote


def flatten(tree, prefix: str = "") -> list[str]:
  """Dotted paths of a JSON value's leaves (a list is a leaf; an empty dict too)."""
  if isinstance(tree, dict) and tree:
    return [p for k, v in tree.items() for p in flatten(v, f"{prefix}{k}.")]
  return [prefix[:-1]] if prefix else []


def run_outputs(out: str, rows: list[dict], summary: dict | None = None,
                plots: Iterable[str] = ()) -> list[str]:
  """The names a run folder holds (what a run wrote): its files and folders, the rows'
  figures in metrics.jsonl (and metrics.csv, TensorBoard, where written), summary.json's
  fields (`summary`: the dict about to be written, else the file's) and `plots` about
  to be written."""
  names = set()
  for entry in os.listdir(out):
    names.add(entry + "/" if os.path.isdir(os.path.join(out, entry)) else entry)
  names |= set(plots)
  if summary is None and os.path.exists(os.path.join(out, "summary.json")):
    with open(os.path.join(out, "summary.json")) as f:
      summary = json.load(f)
  if summary is not None:
    names.add("summary.json")
    names |= {f"summary.json:{p}" for p in flatten(summary)}
  keys = {k for row in rows for k in row}
  for table in ("metrics.jsonl", "metrics.csv", "tensorboard/"):
    if table in names:
      names |= {f"{table}:{k}" for k in keys}
  return sorted(names)


def undeclared(names: Iterable[str], cfg) -> list[str]:
  """The names that no declaration covers."""
  return [n for n in names if declaration(n, cfg) is None]


def not_accounted(cfg, written: Iterable[str] | None, facts: dict | None = None) -> list[str]:
  """The report's not_accounted: the mechanism's INFLUENCES that apply (`facts`: the
  run's pooled_scaling, cohort_overflow), then one line per group of `written` outputs
  that are not covered, with what they reveal. `written` None: no run folder (the
  Python API), the influences only."""
  facts = facts or {}
  lines = [line.format(**facts) for when, line in INFLUENCES.values() if when(cfg, facts)]
  groups: dict[str, list[str]] = {}
  for name in sorted(written or ()):
    found = declaration(name, cfg)
    if found is not None and found.status == NOT_COVERED:
      groups.setdefault(found.says, []).append(_shown(name))
  for says, names in groups.items():
    lines.append(f"{', '.join(_collapse(names))}: {says}")
  return lines


def _shown(name: str) -> str:
  file, _, key = name.partition(":")
  return f"{file} {key}" if key else file


def _collapse(names: list[str]) -> list[str]:
  """`file a, file b` -> `file a, b`; tables of the same figures are named together."""
  out, last = [], None
  for n in names:
    file, _, key = n.partition(" ")
    out.append(key if (file == last and key) else n)
    last = file
  return out


# ------------------------------------------------------------------ a sweep's own outputs


def _csv_columns(path: str) -> list[str]:
  import csv
  if not os.path.exists(path):
    return []
  with open(path, newline="") as f:
    return next(csv.reader(f), [])


def sweep_outputs(out: str, record: dict) -> list[str]:
  """The names a sweep folder's own outputs hold ('sweep:file[:key]'): its files, the
  tables' columns and sweep.json's fields (`record`, about to be written); the cells
  are run folders, each with its own report."""
  names = set()
  for entry in os.listdir(out):
    names.add("sweep:" + (entry + "/" if os.path.isdir(os.path.join(out, entry)) else entry))
  for table in ("results.csv", "final.csv"):
    columns = _csv_columns(os.path.join(out, table))
    names |= {f"sweep:{table}:{c}" for c in columns}
    if table == "results.csv" and os.path.exists(os.path.join(out, "results.parquet")):
      names |= {f"sweep:results.parquet:{c}" for c in columns}
  names |= {f"sweep:sweep.json:{p}" for p in flatten(record)}
  return sorted(names)


def sweep_privacy(cfgs: list, written: Iterable[str]) -> dict:
  """sweep.json's privacy section: each cell is a release of its own (its own draws:
  release_identity.py), so publishing several composes their epsilons; and the
  sweep's own outputs that no cell's guarantee covers (a name counts as not covered
  if it is under any cell's config)."""
  guaranteed = [c for c in cfgs if get_mechanism(c.dp).private or kept_noise_of(c) is not None]
  section = {"releases": len(cfgs), "composition": (
      "each cell is a release of its own: its settings and seed give it its own cohorts and "
      "noise, and its summary.json gives its own epsilon; publishing several cells of one "
      "dataset composes their epsilons (two cells of the same settings and seed would be one "
      "release)")}
  if guaranteed:
    lines = []
    for cfg in guaranteed:
      lines += [line for line in not_accounted(cfg, written) if line not in lines]
    section["not_accounted"] = lines
  return section


# ------------------------------------------------------------------ the README's table



def _status_text(status) -> str:
  return _CONDITIONS[status] if callable(status) else status


def markdown() -> str:
  """The README's table of everything a run can publish (What the guarantee covers),
  from the registry's declarations; tests/test_releases.py keeps the README equal to it."""
  rows = [("metrics rows (metrics.jsonl, metrics.csv, TensorBoard, summary.json `final`, "
           "a sweep's tables, compare)", None, None)]
  rows += [(f"`{k}`", s, says) for k, (s, says) in FIGURES.items()]
  rows += [("`<stage>.<metric>`", "as the stage declares it; not covered where no stage of "
            "the run declares it", "a stage's own figure (RoundStats.metrics), summed over the "
            "row's rounds: what the stage's `declares` says")]
  rows += [("run folder", None, None)]
  rows += [(f"`{k}`", s, says) for k, (s, says) in RUN_FILES.items() if not k.endswith(".tmp")]
  rows += [(f"`{k}`", *_plot_row(k)) for k in ("<metric>.png", *PLOT_FIGURES)]
  rows += [("summary.json (besides `final`)", None, None)]
  rows += [(f"`{k}`", s, says) for k, (s, says) in SUMMARY.items() if k != "privacy.**"]
  rows += _bundle_rows_text()
  rows += [("`privacy.**`", *SUMMARY["privacy.**"])]
  rows += [("sweep, audit, attack, compare, profile, account, datasets", None, None)]
  rows += [(f"`{k}`", s, says) for k, (s, says) in OTHER_FILES.items()]
  rows += [(f"`{k}` (sweep and compare tables)", s, says) for k, (s, says)
           in TABLE_COLUMNS.items()]
  lines = ["| published | status | what it is, or what it reveals |", "| --- | --- | --- |"]
  for name, status, says in rows:
    lines.append(f"| **{name}** | | |" if status is None else
                 f"| {name} | {_status_text(status)} | {says} |")
  lines += ["", "Not covered whatever the run publishes (listed in `not_accounted` where they "
            "apply):", ""]
  lines += [f"* {line.replace('{cohort_overflow}', 'N')}" for _, line in INFLUENCES.values()]
  return "\n".join(lines) + "\n"


def _bundle_rows_text() -> list[tuple[str, str, str]]:
  """The registered privacy bundles' summary.json rows, each path's status by the
  mechanism or calibration it is under ('not covered under kept_noise 'paper'; public
  under kept_noise 'multiplier'')."""
  by_bundle = [(f"dp {m.name!r}", m.releases) for m in MECHANISMS.values()]
  by_bundle += [(f"kept_noise {k.name!r}", kept_noise.releases(k)) for k in KEPT_NOISE.values()]
  statuses: dict[str, dict[str, str]] = {}
  says: dict[str, str] = {}
  for bundle, rows in by_bundle:
    for pattern, status, text in rows:
      statuses.setdefault(pattern, {}).setdefault(bundle, status)
      says.setdefault(pattern, text)
  out = []
  for pattern, of in statuses.items():
    kinds = {s: [b for b in of if of[b] == s] for s in dict.fromkeys(of.values())}
    text = (next(iter(kinds)) if len(kinds) == 1 else
            "; ".join(f"{s} under {' or '.join(bs)}" for s, bs in kinds.items()))
    out.append((f"`{pattern}`", text, says[pattern]))
  return out


def _plot_row(file: str):
  keys = PLOT_FIGURES.get(file, ("test_*",))
  statuses = [FIGURES[k if k in FIGURES else "test_*"][0] for k in keys]
  worst = next((s for s in statuses if s == NOT_COVERED), statuses[0])
  return worst, f"plots {', '.join(keys)}"
