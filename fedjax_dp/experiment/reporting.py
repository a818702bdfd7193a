"""Run outputs: metrics.jsonl (one object per evaluation), summary.json, PNG plots."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from typing import Any

from fedjax_dp.placement.processes import is_primary

METRIC_KEYS = ("round", "test_accuracy", "test_loss", "train_loss", "epsilon", "delta",
               "bytes_up", "bytes_down", "wall_s")


def write_json_atomic(path: str, obj: Any, mode: int | None = None) -> None:
  """Writes JSON through a temporary file and a rename: a reader never sees half a file.
  A non-finite number is written as null (JSON has no NaN or Infinity).
  `mode`: the file's permission bits from its creation on (e.g. 0o600 for a secret).
  Like every writer here, a no-op outside process 0 of a run of many (processes.py)."""
  if not is_primary():
    return
  tmp = f"{path}.tmp"
  if mode is not None:
    if os.path.exists(tmp):
      os.remove(tmp)   # os.open's mode applies only to a file it creates
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode))
  from fedjax_dp.experiment.divergence import json_safe
  with open(tmp, "w") as f:
    json.dump(json_safe(obj), f, indent=2, sort_keys=True, allow_nan=False)
    f.write("\n")
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def write_text_atomic(path: str, text: str) -> None:
  """Writes text through a temporary file and a rename (see write_json_atomic)."""
  if not is_primary():
    return
  tmp = f"{path}.tmp"
  with open(tmp, "w", newline="") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def csv_text(rows: list[dict]) -> str:
  """rows (dicts with the same keys) as CSV text with a header row."""
  buf = io.StringIO()
  w = csv.DictWriter(buf, fieldnames=list(rows[0]))
  w.writeheader()
  w.writerows(rows)
  return buf.getvalue()


def save_figure_atomic(fig, path: str, **kwargs) -> None:
  """fig.savefig through a temporary file (same extension, for the format) and a rename."""
  if not is_primary():
    return
  root, ext = os.path.splitext(path)
  tmp = f"{root}.tmp{ext}"
  fig.savefig(tmp, **kwargs)
  os.replace(tmp, path)


def read_metrics(path: str) -> list[dict]:
  """Reads metrics.jsonl, ignoring a torn last line left by a killed process."""
  if not os.path.exists(path):
    return []
  rows = []
  with open(path) as f:
    for line in f:
      line = line.strip()
      if not line:
        continue
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:
        break
  return rows


def rewrite_metrics(path: str, rows: list[dict]) -> None:
  if not is_primary():
    return
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    for row in rows:
      f.write(json.dumps(row, allow_nan=False) + "\n")   # rows are divergence.finite_row's
  os.replace(tmp, path)


def append_metrics(path: str, row: dict) -> None:
  if not is_primary():
    return
  with open(path, "a") as f:
    f.write(json.dumps(row, allow_nan=False) + "\n")   # rows are divergence.finite_row's
    f.flush()


# a data attack's success on its test set (adversary/poisoning.py), in metrics.jsonl
ATTACK_METRICS = ("attack_success_rate", "target_misclassification")


def plot_panels(rows: list[dict], epsilon_is: str | None = None) -> list[tuple[str, str, list]]:
  """The plots plot_metrics draws from `rows`: (file, y label, [(legend label, key,
  scale, style)]) each, so that a run can declare them before they are drawn.
  `epsilon_is`: whose epsilon the rows carry where it is not the run's (local DP: 'the
  largest client's')."""
  if not rows:
    return []
  tests = [k[len("test_"):] for k in rows[0] if k.startswith("test_") and k != "test_loss"]
  mb = 1e-6
  panels = [   # (file, y label, [(legend label, key, scale, style)])
      *((f"{name}.png", f"test {name}", [(None, f"test_{name}", 1, {})]) for name in tests),
      ("loss.png", "loss", [("test", "test_loss", 1, {}), ("train", "train_loss", 1, {})]),
      # the down link dashed over the up link: equal curves stay both visible
      ("bytes.png", "cumulative MB sent (all participants)",
       [("up (clients to server)", "bytes_up", mb, {"linewidth": 3, "alpha": 0.6}),
        ("down (server to clients)", "bytes_down", mb, {"linestyle": "--"})]),
  ]
  attack = [(k.replace("_", " "), k, 1, {}) for k in ATTACK_METRICS if k in rows[0]]
  if attack:
    panels.append(("attack.png", "share of the test examples",
                   attack + [("test accuracy (main task)", "test_accuracy", 1,
                              {"linestyle": "--"})]))
  accounted = [r for r in rows if r.get("epsilon") is not None]
  if accounted:
    names = sorted({r.get("epsilon_accountant") or "rdp" for r in accounted})
    whose = f" by {epsilon_is.removesuffix(chr(39) + 's')}" if epsilon_is else ""
    panels.append((
        "epsilon.png", f"epsilon spent{whose} ({' or '.join(names)}"
                       f"{', the smaller' if len(names) > 1 else ''}, delta "
                       f"{accounted[-1]['delta']:g})", [(None, "epsilon", 1, {})]))
  return panels


def _spans_decades(values, decades: float = 2.0) -> bool:
  """The finite positive values span more than `decades` orders of magnitude."""
  positive = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v) and v > 0]
  return bool(positive) and max(positive) > min(positive) * 10 ** decades


def plot_metrics(rows: list[dict], out_dir: str, title: str | None = None,
                 target_epsilon: float | None = None, epsilon_is: str | None = None) -> list[str]:
  """Each test metric but the loss (accuracy.png; regression: mse.png, mae.png), loss,
  bytes in MB (and epsilon when accounted, with `target_epsilon` drawn), and under a
  data attack its success with the main accuracy beside it (attack.png) against
  rounds (whole rounds on the axis), titled `title`; a round whose figure was not
  finite is marked by a red dotted line, and a panel whose positive values span more
  than two decades (a diverging loss) is drawn on a log scale. Returns the PNG paths."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.ticker import MaxNLocator

  if not rows:
    return []
  rounds = [r["round"] for r in rows]
  paths = []
  for filename, ylabel, series in plot_panels(rows, epsilon_is):
    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=120)
    for label, key, scale, style in series:
      pts = [(x, r[key] * scale) for x, r in zip(rounds, rows) if r.get(key) is not None]
      if pts:
        ax.plot(*zip(*pts), marker="." if len(pts) < 50 else None, label=label, **style)
      gaps = [x for x, r in zip(rounds, rows) if key in r.get("nonfinite", ())]
      for i, x in enumerate(gaps):
        ax.axvline(x, color="red", linestyle=":", linewidth=1,
                   label=f"{key}: not finite" if i == 0 else None)
    if filename == "epsilon.png" and target_epsilon is not None:
      ax.axhline(target_epsilon, color="black", linestyle="--", linewidth=1,
                 label=f"target {target_epsilon:g}")
    if filename == "bytes.png":
      ax.ticklabel_format(axis="y", useOffset=False, style="plain")   # MB as they are
    elif _spans_decades([r.get(key) for _, key, _, _ in series for r in rows]):
      ax.set_yscale("log")   # a loss of 1e33 beside one of 2: both readable
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))   # rounds are whole
    if max(rounds) - min(rounds) < 2:   # one evaluation: the locator's ticks were 4.8, 4.9
      ax.set_xlim(min(rounds) - 1, max(rounds) + 1)
      ax.set_xticks(sorted(set(rounds)))
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    if title:
      ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, filename)
    save_figure_atomic(fig, path)
    plt.close(fig)
    paths.append(path)
  return paths
