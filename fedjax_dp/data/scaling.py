"""Standardising tabular features: pooled, per client, or none (FEATURE_SCALINGS).

`load_dataset` applies 'pooled' (the training set's mean and deviation) or
'none' (raw); 'per_client' needs the partition, so `experiment.setup.setup`
applies it after partitioning (`apply_feature_scaling`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedjax_dp.data.dataset import Dataset
from fedjax_dp.errors import DataError

FEATURE_SCALINGS = ("pooled", "per_client", "none")


def _moments(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Per-column mean and deviation of x's rows; a constant column's deviation is 1."""
  mean, std = x.mean(0), x.std(0)
  return mean, np.where(std > 0, std, 1.0)


def _standardize(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  mean, std = _moments(train)
  return ((train - mean) / std).astype(np.float32), ((test - mean) / std).astype(np.float32)


def scale_features(x_train: np.ndarray, x_test: np.ndarray, parts: list[np.ndarray] | None,
                   mode: str) -> tuple[np.ndarray, np.ndarray]:
  """Standardises tabular features [N, d]; returns float32 (x_train, x_test).

  With mu(S), sigma(S) the per-column mean and deviation of the rows S (sigma = 1
  for a constant column):

    pooled      x_i <- (x_i - mu(T)) / sigma(T) for every training and test row,
                T = all training rows. Every client's rows enter mu(T) and sigma(T),
                so one client's data moves every client's inputs.
    per_client  x_i <- (x_i - mu(P_k)) / sigma(P_k) for i in P_k = parts[k], client k's
                rows: a client's inputs depend on its own data only. The test set is
                standardised with its own statistics, x_j <- (x_j - mu(E)) / sigma(E)
                over the test rows E, like one more client doing the same: it reads no
                training client's data, and needs no public statistics (which csv data
                does not have). Computed in float64 from x as given.
    none        x as given (raw), as float32.

  parts: disjoint index arrays into x_train (needed for per_client only); a row in
  no part is never trained on and stays raw.
  """
  if mode == "pooled":
    return _standardize(x_train, x_test)
  if mode == "none":
    return x_train.astype(np.float32), x_test.astype(np.float32)
  if mode != "per_client":
    raise DataError(f"feature_scaling {mode!r}: allowed values are "
                    f"{', '.join(FEATURE_SCALINGS)}")
  if parts is None:
    raise DataError("feature_scaling 'per_client' needs the partition (parts): each client "
                    "standardises its own rows")
  rows = np.concatenate([np.asarray(p, np.int64) for p in parts]) if parts else np.zeros(0, int)
  if len(np.unique(rows)) != len(rows):
    raise DataError("feature_scaling 'per_client': a training row is in more than one client's "
                    "part; the parts must be disjoint")
  out = x_train.astype(np.float32)
  for p in parts:
    if len(p):
      x = x_train[p].astype(np.float64)
      mean, std = _moments(x)
      out[p] = ((x - mean) / std).astype(np.float32)
  test = x_test.astype(np.float64)
  mean, std = _moments(test)
  return out, ((test - mean) / std).astype(np.float32)


def apply_feature_scaling(ds: Dataset, parts: list[np.ndarray], mode: str) -> Dataset:
  """ds with its features scaled by `mode`, after partitioning into `parts`.

  `load_dataset` applies 'pooled' and 'none' itself (pooled from the loader's raw
  precision); 'per_client' is applied here to data loaded with 'none'. Data
  loaded with another scaling than `mode` is an error: it cannot be undone."""
  if ds.feature_scaling == mode:
    return ds
  if mode == "per_client" and ds.feature_scaling == "none":
    x_train, x_test = scale_features(ds.x_train, ds.x_test, parts, mode)
    return dataclasses.replace(ds, x_train=x_train, x_test=x_test, feature_scaling=mode)
  load_as = "none" if mode == "per_client" else mode
  raise DataError(f"dataset {ds.name!r} was loaded with feature_scaling {ds.feature_scaling!r} "
                  f"but the config resolves it to {mode!r}: load it with "
                  f"experiment.setup.load_data(cfg) or load_dataset(..., "
                  f"feature_scaling={load_as!r})")
