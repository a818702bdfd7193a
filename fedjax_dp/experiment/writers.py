"""Live metrics writers: where a run's evaluation rows go while it runs, besides
metrics.jsonl (always written; the run's record, which a resume reads back).

A writer is three plain functions (MetricsWriter): `start(rows)` once, with the
rows a resumed run keeps (empty for a new run); `write(row)` for each new row (a
metrics.jsonl row: round, test_<metric>, train_loss, epsilon, ...; null where not
finite or not measured); `close()` at the end. `callbacks.log_metrics(*writers)`
runs them. Shipped:

  csv(out)          out/metrics.csv, one line per row, the header growing with
                    new keys (the file is then rewritten whole)
  tensorboard(out)  event files in out/tensorboard/ (tensorboardX, the optional
                    extra `pip install 'fedjax-dp[tensorboard]'`): one scalar per
                    numeric key, step = round; `tensorboard --logdir out/tensorboard`

A resumed run re-writes the rows after its checkpoint: to CSV whole (the file
matches metrics.jsonl), to TensorBoard as new events at the same steps with the
same values (the rounds re-run bit for bit).
"""

from __future__ import annotations

import os
from typing import Callable, NamedTuple

from fedjax_dp.errors import ConfigError
from fedjax_dp.experiment import reporting
from fedjax_dp.experiment.reporting import METRIC_KEYS
from fedjax_dp.placement.processes import is_primary

KINDS = ("csv", "tensorboard")


class MetricsWriter(NamedTuple):
  name: str
  start: Callable[[list[dict]], None]
  write: Callable[[dict], None]
  close: Callable[[], None]


def _columns(rows: list[dict]) -> list[str]:
  """METRIC_KEYS first (those present), then every other key in order of appearance."""
  seen = list(dict.fromkeys(k for r in rows for k in r))
  return [k for k in METRIC_KEYS if k in seen] + [k for k in seen if k not in METRIC_KEYS]


def _cell(value) -> str:
  if value is None:
    return ""
  if isinstance(value, list):
    return " ".join(map(str, value))   # 'nonfinite': the keys it lists
  return repr(value) if isinstance(value, float) else str(value)


def csv(out: str) -> MetricsWriter:
  """out/metrics.csv: the rows as a table (empty cell: null)."""
  import csv as csv_lib
  path = os.path.join(out, "metrics.csv")
  rows: list[dict] = []
  columns: list[str] = []

  def rewrite() -> None:
    columns[:] = _columns(rows)
    text = ",".join(columns) + "\n" + "".join(_line(r) for r in rows)
    reporting.write_text_atomic(path, text)

  def _line(row: dict) -> str:
    import io
    buf = io.StringIO()
    csv_lib.writer(buf, lineterminator="\n").writerow([_cell(row.get(k)) for k in columns])
    return buf.getvalue()

  def start(kept: list[dict]) -> None:
    rows[:] = list(kept)
    rewrite()

  def write(row: dict) -> None:
    rows.append(row)
    if any(k not in columns for k in row):
      rewrite()
      return
    if is_primary():
      with open(path, "a") as f:
        f.write(_line(row))

  return MetricsWriter("csv", start, write, lambda: None)


def tensorboard(out: str) -> MetricsWriter:
  """Event files under out/tensorboard/: each numeric key a scalar at step = round."""
  summary = _summary_writer_class()
  logdir = os.path.join(out, "tensorboard")
  holder = []

  def start(kept: list[dict]) -> None:
    if is_primary():
      holder.append(summary(logdir))

  def write(row: dict) -> None:
    if not holder:
      return
    for key, value in row.items():
      if key != "round" and isinstance(value, (int, float)) and not isinstance(value, bool):
        holder[0].add_scalar(key, value, global_step=row["round"])
    holder[0].flush()

  def close() -> None:
    if holder:
      holder[0].close()

  return MetricsWriter("tensorboard", start, write, close)


def _summary_writer_class():
  try:
    from tensorboardX import SummaryWriter
  except ImportError:
    raise ConfigError("--log tensorboard needs the tensorboardX package: pip install "
                      "'fedjax-dp[tensorboard]' (or tensorboardX)") from None
  return SummaryWriter


def writers_for(kinds, out: str) -> list[MetricsWriter]:
  """The writers `fedjax-dp run --log KIND ...` asks for (a ConfigError names a kind
  that is not one, or a missing optional package, before the run starts)."""
  made = {"csv": csv, "tensorboard": tensorboard}
  out_writers = []
  for kind in dict.fromkeys(kinds):
    if kind not in made:
      raise ConfigError(f"--log {kind}: allowed are {', '.join(KINDS)} (metrics.jsonl is "
                        "always written)")
    out_writers.append(made[kind](out))
  return out_writers
