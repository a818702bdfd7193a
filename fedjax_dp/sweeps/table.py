"""A sweep's results: the tidy table, the per-setting means and their plots.

results.csv / results.parquet: one row per cell x evaluation, with columns
  cell, setting (the name but the seed), <each key that names cells> (seed
  included; null where the cell's run reads no such key), round, <every
  metrics.jsonl key>
(a list value, such as `nonfinite`, joined by ';'). final.csv: one row per
setting (the cells but their seeds) with the number of seeds, the last round
(and round_min where budgets stopped seeds at different rounds) and, for each
numeric column of the cells' last rows, its mean and sample sd over the seeds
whose value is a finite number (<column>_seeds says how many, where not all).
<metric>.png: the mean over seeds against rounds, one line per setting, with a
band of +- one sd (rounds every seed of a setting evaluated).

Parquet is written with pyarrow: typed columns (nulls kept) that pandas, polars,
DuckDB and Spark read without parsing text.
"""

from __future__ import annotations

import math
import os
import statistics

from fedjax_dp import losses
from fedjax_dp.experiment import reporting

RESULTS_CSV, RESULTS_PARQUET, FINAL_CSV = "results.csv", "results.parquet", "final.csv"


def tidy_rows(out: str, cells, named: list[str]) -> list[dict]:
  """Every cell's metrics.jsonl rows, each with the cell's name, its setting (the
  name but the seed) and its named keys."""
  from fedjax_dp.sweeps.run import cell_dir
  rows = []
  for cell in cells:
    keys = {k: _cell_value(cell, k) for k in named}
    for row in reporting.read_metrics(os.path.join(cell_dir(out, cell), "metrics.jsonl")):
      rows.append({"cell": cell.name, "setting": setting_name(cell, named), **keys,
                   **{k: ";".join(map(str, v)) if isinstance(v, list) else v
                      for k, v in row.items()}})
  return _same_columns(rows)


def _cell_value(cell, key: str):
  """A named key's value in a cell's config; None where nothing in the cell's run
  reads it (prox_mu of a FedAvg cell)."""
  from fedjax_dp.recipes.config_checks import unread_keys
  if key not in cell.values and key in unread_keys(cell.cfg):
    return None
  value = getattr(cell.cfg, key)
  return "-".join(map(str, value)) if isinstance(value, tuple) else value


def setting_name(cell, named: list[str]) -> str:
  """A cell's setting: its name's keys but the seed ('all' in a sweep of seeds alone)."""
  from fedjax_dp.sweeps.spec import _shown
  parts = [f"{k}={_shown(cell.values[k])}" for k in named
           if k != "seed" and k in cell.values]
  return ",".join(parts) or "all"


def _same_columns(rows: list[dict]) -> list[dict]:
  """Every row with every column (in order of first appearance; None where absent)."""
  columns = list(dict.fromkeys(k for row in rows for k in row))
  return [{k: row.get(k) for k in columns} for row in rows]


def final_rows(rows: list[dict], named: list[str]) -> list[dict]:
  """Per setting: seeds, the last round, and mean / sd over seeds of each numeric
  column of each cell's last row (sd: sample sd, None with one value), over the
  seeds where it is a finite number."""
  last: dict[str, dict] = {}
  for row in rows:
    last[row["cell"]] = row   # rows are in round order within a cell
  by_setting: dict[str, list[dict]] = {}
  for row in last.values():
    by_setting.setdefault(row["setting"], []).append(row)
  out = []
  skip = {"cell", "setting", "seed", "round", *named}
  for setting, group in by_setting.items():
    rounds = [r["round"] for r in group]
    entry = {"setting": setting, **{k: group[0][k] for k in named if k != "seed"},
             "seeds": len(group), "round": max(rounds),
             **({"round_min": min(rounds)} if min(rounds) != max(rounds) else {})}
    for key in group[0]:
      values = [r[key] for r in group if _is_number(r.get(key))]
      if key in skip or not values:
        continue
      entry[f"{key}_mean"] = statistics.fmean(values)
      entry[f"{key}_sd"] = statistics.stdev(values) if len(values) > 1 else None
      if len(values) < len(group):
        entry[f"{key}_seeds"] = len(values)
    out.append(entry)
  return _same_columns(out)


def _is_number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


MAX_PLOTTED_SETTINGS = 20   # more lines than this make a legend no one can read


def write_results(out: str, cells, named: list[str], task: losses.Task) -> dict:
  """Writes the tidy table (CSV, Parquet), final.csv and the plots (up to
  MAX_PLOTTED_SETTINGS settings; with more, earlier plots are removed and
  'plots_skipped' says why); returns their paths."""
  rows = tidy_rows(out, cells, named)
  paths = {"table": [], "final": None, "plots": []}
  if not rows:
    return paths
  csv_path = os.path.join(out, RESULTS_CSV)
  reporting.write_text_atomic(csv_path, reporting.csv_text(rows))
  parquet_path = os.path.join(out, RESULTS_PARQUET)
  write_parquet(rows, parquet_path)
  final_path = os.path.join(out, FINAL_CSV)
  reporting.write_text_atomic(final_path, reporting.csv_text(final_rows(rows, named)))
  metrics = [f"test_{m}" for m in task.metrics] + ["train_loss", "epsilon"]
  settings = len({r["setting"] for r in rows})
  if settings > MAX_PLOTTED_SETTINGS:
    for m in metrics:   # a plot of an earlier, smaller sweep would be read as this one's
      stale = os.path.join(out, f"{m.removeprefix('test_')}.png")
      if os.path.exists(stale):
        os.remove(stale)
    return {"table": [csv_path, parquet_path], "final": final_path, "plots": [],
            "plots_skipped": f"{settings} settings, more than {MAX_PLOTTED_SETTINGS} lines a "
                             "plot can show: final.csv and results.csv hold the numbers"}
  plots = plot_over_seeds(rows, named, [m for m in metrics if any(r.get(m) is not None
                                                                   for r in rows)],
                          out, title=os.path.basename(os.path.abspath(out)))
  return {"table": [csv_path, parquet_path], "final": final_path, "plots": plots}


def write_parquet(rows: list[dict], path: str) -> None:
  """rows as a Parquet file (through a temporary file and a rename)."""
  import pyarrow as pa
  import pyarrow.parquet as pq
  columns = {k: [r[k] for r in rows] for k in rows[0]}
  for k, values in columns.items():   # ints and floats in one column: floats
    if any(isinstance(v, float) for v in values) and any(
        isinstance(v, int) and not isinstance(v, bool) for v in values):
      columns[k] = [float(v) if isinstance(v, int) else v for v in values]
  tmp = f"{path}.tmp"
  pq.write_table(pa.table(columns), tmp)
  os.replace(tmp, path)


def mean_sd_curves(rows: list[dict], named: list[str], metric: str) -> dict[str, list]:
  """{setting: [(round, mean, sd, seeds)]} over the rounds every seed of the setting
  has a finite `metric` at."""
  per: dict[str, dict[str, dict[int, float]]] = {}
  for row in rows:
    if _is_number(row.get(metric)):
      per.setdefault(row["setting"], {}).setdefault(row["cell"], {})[
          row["round"]] = row[metric]
  curves = {}
  for setting, cells in per.items():
    common = set.intersection(*(set(v) for v in cells.values()))
    curves[setting] = [
        (r, statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0,
         len(vals))
        for r in sorted(common) for vals in [[c[r] for c in cells.values()]]]
  return curves


def plot_over_seeds(rows: list[dict], named: list[str], metrics: list[str], out: str,
                    title: str) -> list[str]:
  """<metric>.png for each metric: mean +- sd over seeds against rounds."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  paths = []
  for metric in metrics:
    curves = mean_sd_curves(rows, named, metric)
    if not curves:
      continue
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for setting, pts in curves.items():
      r, m, s, n = zip(*pts)
      line, = ax.plot(r, m, marker="." if len(r) < 50 else None,
                      label=f"{setting} ({max(n)} seed{'s' if max(n) > 1 else ''})")
      ax.fill_between(r, [a - b for a, b in zip(m, s)], [a + b for a, b in zip(m, s)],
                      color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("round")
    ax.set_ylabel(f"{metric.replace('_', ' ')} (mean +- sd over seeds)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(out, f"{metric.removeprefix('test_')}.png")
    reporting.save_figure_atomic(fig, path)
    plt.close(fig)
    paths.append(path)
  return paths


def final_lines(final_csv: str) -> list[str]:
  """final.csv as lines for the terminal: each setting's seeds and last-round test
  metrics and epsilon, mean +- sd."""
  import csv
  with open(final_csv, newline="") as f:
    rows = list(csv.DictReader(f))
  lines = []
  for row in rows:
    shown = []
    for key in row:
      if key.endswith("_mean") and row[key] not in (None, "") and (
          key.startswith("test_") or key == "epsilon_mean"):
        name = key[:-len("_mean")]
        sd, n = row.get(f"{name}_sd"), row.get(f"{name}_seeds")
        shown.append(f"{name.replace('_', ' ')} {float(row[key]):.4f}"
                     + (f" +- {float(sd):.4f}" if sd not in (None, "") else "")
                     + (f" ({n} seeds finite)" if n not in (None, "") else ""))
    rounds = (f"rounds {row['round_min']}-{row['round']}" if row.get("round_min") not in
              (None, "") else f"round {row['round']}")
    lines.append(f"{row['setting']} ({row['seeds']} seed{'s' if row['seeds'] != '1' else ''}, "
                 f"{rounds}): " + (", ".join(shown) or "no finite test metric"))
  return lines
