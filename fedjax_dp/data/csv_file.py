"""A CSV file as a classification Dataset: a header row, numeric features, a label column.

Labels may be integers or names (mapped, sorted, to 0..K-1); every feature
must be a finite number; an optional tier map (tabular.read_tier_map) gives
the columns' sensitivity tiers. Features come back raw (float64), for
`load_dataset` to scale.
"""

from __future__ import annotations

import csv
import os

import numpy as np

from fedjax_dp.data.dataset import Dataset, train_test_split
from fedjax_dp.errors import DataError


def load_csv(path: str | None, label_column: str = "label", test_fraction: float = 0.2,
             seed: int = 0, tier_map: str | None = None) -> Dataset:
  if not path:
    raise DataError("dataset 'csv' needs csv_path")
  if not os.path.isfile(path):
    raise DataError(f"{path}: no such CSV file")
  try:
    # utf-8-sig: spreadsheet exports start with a byte-order mark
    with open(path, newline="", encoding="utf-8-sig") as f:
      rows = list(csv.reader(f))
  except UnicodeDecodeError:
    raise DataError(f"{path}: not UTF-8 text, expected a CSV file")
  except csv.Error as e:
    raise DataError(f"{path}: not a CSV file this reader takes ({e})")
  if not rows:
    raise DataError(f"{path}: empty file, expected a header row and data rows")
  header = [h.strip() for h in rows[0]]
  if label_column not in header:
    raise DataError(f"{path}: no column {label_column!r} (columns: {', '.join(header)})")
  li = header.index(label_column)
  feats = [i for i in range(len(header)) if i != li]
  if not feats:
    raise DataError(f"{path}: no feature columns besides {label_column!r}")
  x = np.empty((len(rows) - 1, len(feats)), np.float64)
  labels = []
  for r, row in enumerate(rows[1:]):
    line = r + 2
    if len(row) != len(header):
      raise DataError(f"{path}: line {line} has {len(row)} fields, expected {len(header)}")
    for j, i in enumerate(feats):
      try:
        x[r, j] = float(row[i])
      except ValueError:
        raise DataError(f"{path}: line {line}, column {header[i]!r}: {row[i]!r} is not a number")
      if not np.isfinite(x[r, j]):   # nan / inf parse as floats, then poison training
        raise DataError(f"{path}: line {line}, column {header[i]!r}: {row[i]!r} is not a finite "
                        "number")
    labels.append(row[li].strip())
  if len(labels) < 2:
    raise DataError(f"{path}: {len(labels)} data rows, expected at least 2")
  # Labels may be integers or names: map their sorted distinct values to 0..K-1
  # ("1" and "1.0" are one class; 1.7 is not a class label).
  if "" in labels:
    raise DataError(f"{path}: line {labels.index('') + 2}: empty {label_column!r}")
  try:
    numbers = [float(v) for v in labels]
  except ValueError:
    numbers = None
  if numbers is not None:
    bad = [v for v, f in zip(labels, numbers) if not (np.isfinite(f) and f == int(f))]
    if bad:
      raise DataError(f"{path}: label {bad[0]!r} in column {label_column!r} is not a class "
                      "(expected integers or names; a continuous target is regression)")
    labels = [str(int(f)) for f in numbers]
    classes = sorted(set(labels), key=int)
  else:
    classes = sorted(set(labels))
  if len(classes) < 2:
    raise DataError(f"{path}: column {label_column!r} holds one class ({classes[0]!r}): "
                    "classification needs at least 2")
  lookup = {c: k for k, c in enumerate(classes)}
  y = np.array([lookup[v] for v in labels], np.int32)
  tr, te = train_test_split(len(y), test_fraction, seed)
  names = tuple(header[i] for i in feats)
  tiers = None
  if tier_map:
    from fedjax_dp.data.tabular import TierMapError, read_tier_map
    try:
      tiers = read_tier_map(tier_map, list(names))
    except TierMapError as e:
      raise DataError(str(e))
  return Dataset("csv", x[tr], y[tr], x[te], y[te], max(len(classes), 2), path,
                 feature_names=names, feature_tiers=tiers)
