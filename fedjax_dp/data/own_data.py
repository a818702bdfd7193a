"""Your own data: `from_arrays(x, y, ...)` and `from_clients([(x_i, y_i), ...])`.

Both check the arrays and return a Dataset that carries its own client
partition (`client_parts`); integer targets stay int32 class labels, real
targets float32 (regression), from here to the store and the evaluation.
Its `test_source` says where the test set came from: 'given' (test=), 'split'
(a partition name's test_fraction, held out before partitioning: no client's
rows) or 'client_rows' (client_ids or index lists with test_fraction: each
client's own rows, which a run under dp or kept noise refuses:
experiment/setup.py check_test_source). Every bad value is a one-line DataError.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from fedjax_dp.data.dataset import Dataset, train_test_split
from fedjax_dp.data.partition import PARTITION_KEYS
from fedjax_dp.errors import DataError

# the partitions that read class labels (the others split rows by count alone)
_LABEL_PARTITIONS = ("dirichlet", "shards", "dirichlet_client", "flwr_dirichlet",
                     "inner_dirichlet", "pathological", "shard")


def _features(x, what: str = "x") -> np.ndarray:
  """x [N, ...] as float32, checked: numbers, at least 2-D, every value finite."""
  x = np.asarray(x)
  if x.dtype.kind not in "biuf":
    raise DataError(f"{what} has dtype {x.dtype}: expected numbers (int or float features)")
  if x.ndim < 2:
    raise DataError(f"{what} has shape {x.shape}: expected [N, features...] (one row per "
                    "example; reshape a single feature with x[:, None])")
  x32 = x.astype(np.float32, copy=False)   # float32 arrays are kept, not copied
  flat = x32.reshape(len(x32), int(np.prod(x32.shape[1:])))
  step = max(1, (1 << 24) // max(flat.shape[1], 1))   # 64 MB of rows at a time: no copy of x
  for start in range(0, len(flat), step):
    bad = ~np.isfinite(flat[start:start + step])
    if bad.any():
      row, col = (int(v) for v in np.argwhere(bad)[0])
      value = x.reshape(len(x), -1)[start + row, col]
      raise DataError(f"{what} row {start + row} holds {value} (as float32): features must "
                      "be finite numbers; drop or impute those rows")
  return x32


def _targets(y, n: int, what: str = "y") -> np.ndarray:
  """y as int32 [N] class labels or [N, T] token ids, or float32 [N] / [N, k] real targets,
  checked against n rows."""
  y = np.asarray(y)
  if y.dtype.kind not in "biuf":
    raise DataError(f"{what} has dtype {y.dtype}: expected integer class labels or real "
                    "(float) targets")
  if y.ndim == 0 or len(y) != n:
    raise DataError(f"{what} has {len(y) if y.ndim else 0} rows but x has {n}: one target "
                    "per example")
  if y.dtype.kind == "f":
    if y.ndim > 2:
      raise DataError(f"{what} has shape {y.shape}: expected [N] or [N, k] targets")
    y32 = y.astype(np.float32)
    if not np.isfinite(y32).all():
      row = int(np.argwhere(~np.isfinite(y32))[0][0])
      raise DataError(f"{what} row {row} is not a finite number (as float32): targets must be "
                      "finite")
    return y32
  if y.ndim > 2 or (y.ndim == 2 and y.shape[1] < 2):
    raise DataError(f"{what} has shape {y.shape}: integer targets are class labels [N] (a "
                    "column [N, 1]: pass y.ravel()) or token ids [N, T] with T >= 2 "
                    "(losses.next_token)")
  if n and (y.min() < 0 or y.max() > np.iinfo(np.int32).max):
    bad = y.min() if y.min() < 0 else y.max()
    raise DataError(f"{what} holds class label {bad}: labels must be 0..K-1")
  return y.astype(np.int32)


def _check_parts(parts, n: int) -> list[np.ndarray]:
  """A user's index lists: integers in 0..n-1, every row in exactly one, none empty."""
  out, seen = [], np.zeros(n, np.int64)
  for i, p in enumerate(parts):
    p = np.asarray(p)
    if p.ndim != 1 or (p.size and p.dtype.kind not in "iu"):
      raise DataError(f"partition[{i}]: expected a 1-D array of integer row indices, got "
                      f"dtype {p.dtype} shape {p.shape}")
    if p.size == 0:
      raise DataError(f"partition[{i}] is empty: every client needs at least one row")
    if p.min() < 0 or p.max() >= n:
      raise DataError(f"partition[{i}] holds row {int(p.min() if p.min() < 0 else p.max())}: "
                      f"indices must be in 0..{n - 1}")
    np.add.at(seen, p, 1)
    out.append(np.sort(p).astype(np.int64))
  if not out:
    raise DataError("partition is an empty list: expected one index array per client")
  if (seen != 1).any():
    row = int(np.flatnonzero(seen != 1)[0])
    raise DataError(f"row {row} is in {int(seen[row])} clients' parts: every row must be in "
                    "exactly one (drop unused rows from x and y first)")
  return out


def _client_rows(client_ids, n: int) -> list[np.ndarray]:
  """Index arrays per distinct client id (sorted ids: client k is the k-th)."""
  ids = np.asarray(client_ids)
  if ids.ndim != 1 or len(ids) != n:
    raise DataError(f"client_ids has shape {ids.shape} but x has {n} rows: one client id per "
                    "row")
  if ids.dtype.kind == "f" and not np.all(ids == np.round(ids)):
    raise DataError("client_ids holds non-integer numbers: expected integer or string ids")
  if not n:
    return []
  _, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
  order = np.argsort(inverse.reshape(-1), kind="stable")   # rows grouped by client, in order
  return np.split(order.astype(np.int64), np.cumsum(counts)[:-1])


def _holdout(parts: list[np.ndarray], fraction: float, seed: int):
  """(train parts, test rows): floor(fraction n_i) random rows of each client held out
  (each keeps at least one row)."""
  rng = np.random.default_rng(seed)
  train, test = [], []
  for p in parts:
    p = rng.permutation(p)
    k = int(math.floor(fraction * len(p)))
    test.append(p[:k])
    train.append(np.sort(p[k:]))
  test = np.sort(np.concatenate(test)) if test else np.zeros(0, np.int64)
  if not len(test):
    raise DataError(f"test_fraction {fraction:g} holds out no row (every client has fewer "
                    f"than {math.ceil(1 / fraction)} rows): pass test=(x_test, y_test)")
  return train, test


def _test_arrays(test, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """test=(x_test, y_test), checked against the training arrays' shapes and kind."""
  if not (isinstance(test, (tuple, list)) and len(test) == 2):
    raise DataError("test: expected a pair (x_test, y_test)")
  xt = _features(test[0], "test x")
  yt = _targets(test[1], len(xt), "test y")
  if xt.shape[1:] != x.shape[1:]:
    raise DataError(f"test x has rows of shape {xt.shape[1:]} but x has {x.shape[1:]}: both "
                    "need one shape")
  if yt.dtype != y.dtype or yt.shape[1:] != y.shape[1:]:
    raise DataError(f"test y is {yt.dtype} {yt.shape[1:]} per row but y is {y.dtype} "
                    f"{y.shape[1:]}: both need one kind of target")
  if not len(xt):
    raise DataError("test has no rows: evaluation needs at least one")
  return xt, yt


def _own_dataset(name: str, source: str, x, y, parts, test_rows, test,
                 held_from: str) -> Dataset:
  """The Dataset of rows not in test_rows (or all rows, with test arrays given),
  with `parts` re-indexed into x_train. held_from: the test_source of test_rows
  ('split' or 'client_rows'); given test arrays are 'given'."""
  rows = np.sort(np.concatenate(parts))
  if test is not None:
    xt, yt = _test_arrays(test, x, y)
  else:
    xt, yt = x[test_rows], y[test_rows]
  reindex = [np.searchsorted(rows, p).astype(np.int64) for p in parts]
  labels = y.dtype.kind == "i"
  num_classes = int(max(y.max(), yt.max())) + 1 if labels and len(y) else 0
  if np.array_equal(rows, np.arange(len(x))):   # every row trains: x itself, not a copy
    x_train, y_train = x, y
  else:
    x_train, y_train = x[rows], y[rows]
  return Dataset(name, x_train, y_train, xt, yt, num_classes, source,
                 client_parts=tuple(reindex),
                 test_source="given" if test is not None else held_from)


def from_arrays(x, y, *, client_ids=None, partition=None, num_clients: int | None = None,
                test=None, test_fraction: float | None = None, seed: int = 0,
                name: str = "arrays", **partition_options) -> Dataset:
  """Your arrays as a Dataset that carries its client partition (for fedjax_dp.run).

  x [N, ...]: finite numeric features (kept as float32; a float32 x whose rows all train,
  and a float32 x_test, are used as they are, not copied: do not change them in place
  while the Dataset is in use; a simulation built from it holds its own copy).
  y [N]: integer class labels
  (int32) or real targets (float32, [N] or [N, k]); never cast from one to the other.
  Clients, one of:
    client_ids [N]   the client of each row (ints or strings; client k = k-th sorted id)
    partition        a list of index arrays into x, one per client, each row in exactly
                     one; or a name with num_clients: 'iid', 'quantity' (any targets),
                     'dirichlet', 'shards', 'dirichlet_client' (class labels), options
                     alpha, classes_per_client, quantity_alpha as for the config keys
  Test set, one of:
    test=(x_test, y_test)
    test_fraction=f  (default 0.2) a partition name: a random f of all rows, before
                     partitioning (test_source 'split'); client_ids or index lists:
                     floor(f n_i) random rows of each client (each keeps at least one;
                     test_source 'client_rows', refused under dp or kept noise: the
                     published test metrics would be unnoised functions of clients' rows)
  seed drives every random choice here. DataError (one line) names a bad value.
  """
  x = _features(x)
  y = _targets(y, len(x))
  if (client_ids is None) == (partition is None):
    raise DataError("from_arrays: give exactly one of client_ids (a client per row) or "
                    "partition (index lists, or a name with num_clients)")
  if test is not None and test_fraction is not None:
    raise DataError("from_arrays: give test=(x_test, y_test) or test_fraction, not both")
  f = 0.2 if test_fraction is None else test_fraction
  if not 0 < f < 1:
    raise DataError(f"test_fraction {f!r}: must be in (0, 1)")
  if isinstance(partition, str):
    return _partitioned(name, x, y, partition, num_clients, test, f, seed, partition_options)
  if partition_options or num_clients is not None:
    given = ", ".join(sorted(partition_options) + (["num_clients"] if num_clients else []))
    raise DataError(f"from_arrays: {given} go with a partition name; client_ids and index "
                    "lists fix the clients themselves")
  parts = _client_rows(client_ids, len(x)) if client_ids is not None else _check_parts(
      partition, len(x))
  if not parts:
    raise DataError("from_arrays: x has no rows")
  test_rows = None
  if test is None:
    parts, test_rows = _holdout(parts, f, seed)
  return _own_dataset(name, "from_arrays", x, y, parts, test_rows, test, "client_rows")


def _partitioned(name, x, y, method, num_clients, test, fraction, seed, options) -> Dataset:
  """from_arrays with a partition name: hold out the test rows, then split the rest."""
  from fedjax_dp.data.partition import PARTITIONS, partition
  if method not in PARTITIONS:
    raise DataError(f"partition {method!r}: allowed are {', '.join(PARTITIONS)}, or a list of "
                    "index arrays")
  bad = sorted(set(options) - set(PARTITION_KEYS))
  if bad:
    raise DataError(f"from_arrays: unknown option {bad[0]!r} (allowed: "
                    f"{', '.join(PARTITION_KEYS)})")
  if method in _LABEL_PARTITIONS and y.dtype.kind != "i":
    raise DataError(f"partition {method!r} splits by class label but y holds real targets "
                    f"({y.dtype}): use 'iid', 'quantity', client_ids or index lists")
  if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
    raise DataError(f"partition {method!r} needs num_clients >= 1 (got {num_clients!r})")
  if test is None:
    train, test_rows = train_test_split(len(x), fraction, seed)
  else:
    train, test_rows = np.arange(len(x)), None
  labels = y[train] if y.dtype.kind == "i" else np.zeros(len(train), np.int32)
  parts = [train[p] for p in partition(labels, int(num_clients), method, seed=seed, **options)]
  return _own_dataset(name, f"from_arrays (partition {method})", x, y, parts, test_rows, test,
                      "split")


def from_clients(clients, *, test=None, test_fraction: float | None = None, seed: int = 0,
                 name: str = "clients") -> Dataset:
  """[(x_i, y_i), ...], one pair per client, as a Dataset (see from_arrays: the same
  checks, and test=(x_test, y_test) (test_source 'given') or test_fraction of each
  client's rows (test_source 'client_rows': refused under dp or kept noise))."""
  clients = list(clients)
  if not clients:
    raise DataError("from_clients: no clients: expected a list of (x_i, y_i) pairs")
  xs, ys = [], []
  for i, pair in enumerate(clients):
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
      raise DataError(f"from_clients: client {i}: expected a pair (x_i, y_i)")
    xi = _features(pair[0], f"client {i} x")
    yi = _targets(pair[1], len(xi), f"client {i} y")
    if not len(xi):
      raise DataError(f"from_clients: client {i} has no rows: every client needs at least one")
    if xs and (xi.shape[1:] != xs[0].shape[1:] or yi.dtype != ys[0].dtype
               or yi.shape[1:] != ys[0].shape[1:]):
      raise DataError(f"from_clients: client {i} has x rows {xi.shape[1:]} and y {yi.dtype} "
                      f"{yi.shape[1:]}, client 0 {xs[0].shape[1:]} and {ys[0].dtype} "
                      f"{ys[0].shape[1:]}: every client needs the same shapes")
    xs.append(xi)
    ys.append(yi)
  ids = np.repeat(np.arange(len(xs)), [len(v) for v in xs])
  ds = from_arrays(np.concatenate(xs), np.concatenate(ys), client_ids=ids, test=test,
                   test_fraction=test_fraction, seed=seed, name=name)
  return dataclasses.replace(ds, source=f"from_clients ({len(xs)} clients)")
