"""Datasets whose clients are their own: one Dataset from per-client arrays, and
the clients a run takes of them (partition 'natural_id').

LEAF's FEMNIST writers, TensorFlow Federated's federated EMNIST writers and
CIFAR-100 clients (leaf.py, tff_h5.py) come as arrays per client id. The Dataset
keeps the writers' rows in `client_parts` (in the file's id order), their ids in
`client_ids` and, where the test split holds rows of the same clients (LEAF and
EMNIST split each writer's examples), each client's test rows in `test_parts`.

A run with partition 'natural_id' (`select_clients`) holds out `test_clients`
writers whole as the test set (their training and test rows: no trained client's
data), then takes `num_clients` of the rest, both drawn by the data seed; with
test_clients 0 the test set is the file's test split: where the split is per
writer, the taken clients' own held-out rows (test_source 'client_rows', which a
run under a privacy guarantee refuses: experiment/setup.py), else all of it.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from fedjax_dp.data.dataset import Dataset
from fedjax_dp.errors import DataError

ClientArrays = tuple[str, np.ndarray, np.ndarray]   # (client id, x [n, ...], y [n])


def _offsets(sizes: Sequence[int]) -> tuple[np.ndarray, ...]:
  ends = np.cumsum(sizes)
  return tuple(np.arange(e - s, e, dtype=np.int64) for s, e in zip(sizes, ends))


def _stack(clients: Sequence[ClientArrays], what: str) -> tuple[np.ndarray, np.ndarray]:
  if not clients:
    raise DataError(f"{what}: holds no clients")
  shapes = {c[1].shape[1:] for c in clients}
  if len(shapes) > 1:
    raise DataError(f"{what}: clients' examples have shapes {sorted(shapes)}: one shape needed")
  return (np.concatenate([c[1] for c in clients]), np.concatenate([c[2] for c in clients]))


def from_client_arrays(name: str, train: Sequence[ClientArrays],
                       test: Sequence[ClientArrays], num_classes: int, source: str, *,
                       same_clients: bool) -> Dataset:
  """A Dataset of the training clients' rows in order (client_parts, client_ids)
  and the test clients' rows. `same_clients`: a test client id names the training
  client of that id (LEAF, EMNIST: each writer's held-out examples), whose test
  rows test_parts records; else the test split's clients are other people
  (TFF's CIFAR-100 numbers both splits' clients from 0) and no client's rows."""
  x, y = _stack(train, f"{source} (training split)")
  # a test split may hold none of the clients read (a lazy read's: setup refuses an empty
  # test set in one line, where the run does not hold clients out instead)
  xt, yt = (_stack(test, f"{source} (test split)") if test else
            (np.zeros((0,) + x.shape[1:], x.dtype), np.zeros((0,) + y.shape[1:], y.dtype)))
  if x.shape[1:] != xt.shape[1:]:
    raise DataError(f"{source}: training examples are {x.shape[1:]} and test examples "
                    f"{xt.shape[1:]}: both splits need one shape")
  ids = tuple(c[0] for c in train)
  if len(set(ids)) != len(ids):
    raise DataError(f"{source}: client ids repeat in the training split")
  where = {c[0]: rows for c, rows in zip(test, _offsets([len(c[2]) for c in test]))}
  shared = [i for i in ids if i in where] if same_clients else []
  test_parts = (tuple(where.get(i, np.zeros(0, np.int64)) for i in ids) if shared else None)
  return Dataset(name, x, y, xt, yt, num_classes, source,
                 client_parts=_offsets([len(c[2]) for c in train]), client_ids=ids,
                 test_parts=test_parts, test_source="client_rows" if shared else "split")


def choose_clients(n: int, num_clients: int, test_clients: int, seed: int, name: str
                   ) -> tuple[np.ndarray, np.ndarray]:
  """(held-out clients in draw order, trained clients ascending): indices into a
  dataset's n clients in file order, as select_clients takes them; every client in
  file order where num_clients takes them all."""
  if num_clients < 1:
    raise DataError(f"num_clients = {num_clients}: must be >= 1")
  if test_clients < 0 or test_clients >= n:
    raise DataError(f"test_clients = {test_clients}: dataset {name!r} has {n} clients; "
                    f"allowed are 0 to {n - 1}")
  if num_clients > n - test_clients:
    raise DataError(f"num_clients = {num_clients}: dataset {name!r} has {n} clients"
                    + (f", {n - test_clients} after test_clients {test_clients}" if test_clients
                       else "") + f"; allowed are 1 to {n - test_clients}")
  # drawn by the seed, but for every client in file order (no client is held out)
  order = (np.random.default_rng(seed).permutation(n) if num_clients < n else np.arange(n))
  return order[:test_clients], np.sort(order[test_clients:test_clients + num_clients])


def select_clients(ds: Dataset, num_clients: int, test_clients: int, seed: int
                   ) -> tuple[Dataset, list[np.ndarray]]:
  """(the dataset with only the clients a run takes, their index arrays): the
  `test_clients` held out whole as the test set and `num_clients` others, drawn by
  `seed` (choose_clients)."""
  held, kept = choose_clients(len(ds.client_parts), num_clients, test_clients, seed, ds.name)
  return take_clients(ds, held, kept)


def take_clients(ds: Dataset, held: np.ndarray, kept: np.ndarray
                 ) -> tuple[Dataset, list[np.ndarray]]:
  """select_clients for chosen indices: `kept` clients train, `held` ones are the test set."""
  rows = [ds.client_parts[i] for i in kept]
  x, y = ds.x_train[np.concatenate(rows)], ds.y_train[np.concatenate(rows)]
  out = dataclasses.replace(ds, x_train=x, y_train=y, client_parts=_offsets([len(r) for r in rows]),
                            client_ids=tuple(ds.client_ids[i] for i in kept))
  if len(held):
    out = dataclasses.replace(out, test_parts=None, test_source="split",
                              **_held_out_test(ds, np.sort(held)))
  elif ds.test_parts is not None:   # the test split's rows of the clients taken
    rows = [ds.test_parts[i] for i in kept]
    every = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    out = dataclasses.replace(out, x_test=ds.x_test[every], y_test=ds.y_test[every],
                              test_parts=_offsets([len(r) for r in rows]),
                              test_source="client_rows" if len(every) else "split")
  return out, list(out.client_parts)


def _held_out_test(ds: Dataset, held: np.ndarray) -> dict:
  """x_test, y_test: every row, training and test, of the held-out clients."""
  train_rows = np.concatenate([ds.client_parts[i] for i in held])
  xs, ys = [ds.x_train[train_rows]], [ds.y_train[train_rows]]
  if ds.test_parts is not None:
    test_rows = np.concatenate([ds.test_parts[i] for i in held])
    xs.append(ds.x_test[test_rows])
    ys.append(ds.y_test[test_rows])
  return {"x_test": np.concatenate(xs), "y_test": np.concatenate(ys)}
