"""Partitioners of Flower's datasets library (flwr-datasets 0.6.1, flwr_datasets/partitioner/),
on label arrays, with its names, parameters and random draws.

Flower's partitioners split a Hugging Face dataset; FederatedDataset shuffles its rows
first (shuffle=True, seed=42 by default: Dataset.shuffle(seed) selects the rows
np.random.default_rng(seed).permutation(n)), and each partitioner draws from its own
np.random.default_rng(seed) (seed=42 by default). Here both take the data seed
(config key data_seed, null: seed): the rows are put in
default_rng(seed).permutation(n)'s order, the partitioner runs on them with a fresh
default_rng(seed), making Flower's calls in Flower's order, and each client's rows are
mapped back and sorted. So every method below gives the same row sets as

  ds = Dataset.from_dict({"label": labels}).shuffle(seed=seed)
  partitioner = XPartitioner(..., seed=seed); partitioner.dataset = ds
  partitioner.load_partition(i) for i in range(num_clients)

i.e. FederatedDataset(shuffle=True, seed=seed) with that partitioner (seed=seed)
(tests/test_flwr_datasets_match.py checks it against flwr-datasets: `make test-flwr`).
Flower's `shuffle` argument only orders the rows inside a partition (a last
rng.shuffle per partition); a partition here is a sorted index set, so it has no key.
Classes are the sorted distinct labels (InnerDirichletPartitioner takes the labels
0..K-1 as its classes: the same for labels in 0..K-1).

  iid (partition.py's): IidPartitioner is ds.shard(num_partitions, i, contiguous=True):
      near-equal contiguous blocks, the first n % k one row longer, of the shuffled rows:
      np.array_split(default_rng(seed).permutation(n), k), which `iid` already is.
  flwr_dirichlet  DirichletPartitioner(alpha, min_partition_size, self_balancing): for
      each class in order, shares = rng.dirichlet([alpha] * k); with self_balancing a
      client already holding more than n / k rows gets share 0 and the rest are
      divided by their (left-to-right) sum; the class's rows, in order, are cut at
      int(cumsum(shares)[:-1] * n_class). A draw leaving a client below
      min_partition_size (default 10) is redrawn with the same generator, 11 draws in
      all, then an error (Flower: a warning per redraw, then ValueError). It differs
      from `dirichlet`, which permutes each class and redraws up to 1000 times.
  inner_dirichlet  InnerDirichletPartitioner(partition_sizes, alpha): priors =
      rng.dirichlet([alpha] * K, size=k); until every client is full: a client
      rng.choice(clients not yet seen full) (a full one drawn is dropped from the list
      and the draw is not counted), then a class rng.choice(K, p=priors[client]); a
      class with no rows left gets prior 0 in every client, every row renormalised,
      and the class is drawn again; the client takes the class's last row left.
      client_sizes null: near-equal sizes (np.array_split's).
  pathological  PathologicalPartitioner(num_classes_per_partition,
      class_assignment_mode): client i's classes: random, rng.choice(K, c,
      replace=False); deterministic, (i + j) % K for j < c; first_deterministic
      (Flower's "first-deterministic"), i % K, then rng.choice(K, size=1) until c
      distinct. A class held by m clients has its rows, in order, np.array_split into
      m parts, dealt to those clients by client id.
  shard  ShardPartitioner(num_shards_per_partition, shard_size, keep_incomplete_shard):
      the rows stably sorted by label (Dataset.sort), cut into shards of shard_size
      consecutive rows (null: int(n / (k * shards_per_client))). Usable shards:
      floor(n / shard_size), or ceil (the short last one too) with
      keep_incomplete_shard where shard_size is null or shards_per_client is. Used:
      k * shards_per_client, each client shards_per_client; or, shards_per_client
      null, all usable ones, each client int(used / k), the first used % k one more.
      Shard ids rng.permutation(usable)[:used] are dealt in runs of those counts. As
      Flower's, rows past the used shards are in no client (Flower's documented
      "nearly all the data" and fixed-size splits).
  linear, square, exponential  LinearPartitioner, SquarePartitioner,
      ExponentialPartitioner (IdToSizeFncPartitioner): units f(1..k) = i, i^2, e^i;
      sizes int64(units / sum * n), the last client also taking the n - sum rows
      rounding left; contiguous blocks of the shuffled rows. No draw but the shuffle.

Where Flower warns and leaves rows out (client sizes summing to less than n, a class
no pathological client holds) or fails obscurely, this refuses with one line.
"""

from __future__ import annotations

import math

import numpy as np

from fedjax_dp.errors import DataError

CLASS_ASSIGNMENTS = ("random", "deterministic", "first_deterministic")
_DIRICHLET_DRAWS = 11   # Flower's: the first draw and 10 redraws


def split_by_shares(idx: np.ndarray, shares: np.ndarray) -> list[np.ndarray]:
  """idx cut in order at int(cumsum(shares) len(idx)) (partition.py's dirichlet too)."""
  cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(np.int64)
  return np.split(idx, cuts)


def _flwr_dirichlet(y, k, alpha, min_partition_size, self_balancing, rng):
  """k position arrays into labels y [n]: DirichletPartitioner's split."""
  mean_size = len(y) / k
  for _ in range(_DIRICHLET_DRAWS):
    parts, sizes = [[] for _ in range(k)], np.zeros(k, np.int64)
    for c in np.unique(y):
      shares = rng.dirichlet(np.full(k, float(alpha)))
      if self_balancing:
        shares = np.where(sizes > mean_size, 0.0, shares)
        total = sum(shares.tolist())   # Flower's left-to-right sum (np.sum pairs)
        if total == 0:
          raise DataError(f"flwr_dirichlet: at alpha {alpha} every client below the mean "
                          "size drew share 0 of a class; use a larger alpha or "
                          "self_balancing false")
        shares = shares / total
      for i, piece in enumerate(split_by_shares(np.flatnonzero(y == c), shares)):
        parts[i].append(piece)
        sizes[i] += len(piece)
    if sizes.min() >= min_partition_size:
      return [np.concatenate(p) for p in parts]
  raise DataError(f"flwr_dirichlet: no draw in {_DIRICHLET_DRAWS} gave every one of {k} "
                  f"clients >= min_partition_size {min_partition_size} examples at alpha "
                  f"{alpha}; use a smaller min_partition_size, fewer clients or a larger alpha")


def _client_sizes(client_sizes, k, n):
  """int64 [k]: the given sizes, checked, or near-equal ones."""
  if client_sizes is None:
    return np.array([len(p) for p in np.array_split(np.arange(n), k)], np.int64)
  sizes = list(client_sizes)
  if len(sizes) != k or not all(isinstance(s, (int, np.integer)) and s >= 1 for s in sizes):
    raise DataError(f"client_sizes = {sizes}: needs num_clients = {k} integers >= 1")
  if sum(sizes) != n:
    raise DataError(f"client_sizes = {sizes} sum to {sum(sizes)}: they must sum to the "
                    f"training set's {n} examples")
  return np.array(sizes, np.int64)


def _inner_dirichlet(y, sizes, alpha, rng):
  """len(sizes) position arrays into y [n], of those sizes: InnerDirichletPartitioner's."""
  classes, y_class = np.unique(y, return_inverse=True)
  num_classes = len(classes)
  priors = rng.dirichlet(np.full(num_classes, float(alpha)), size=len(sizes))
  pools = [np.flatnonzero(y_class == c) for c in range(num_classes)]
  left_in_class = [len(p) for p in pools]
  left = [int(s) for s in sizes]
  open_ids, taken, unplaced = list(range(len(sizes))), [[] for _ in sizes], int(sum(left))
  while unplaced:
    i = open_ids[rng.choice(len(open_ids))]   # draws as rng.choice(open_ids)
    if left[i] == 0:
      open_ids.remove(i)
      continue
    left[i] -= 1
    unplaced -= 1
    while True:
      if not np.isfinite(priors[i]).all():   # its classes all used up: Flower's choice fails
        raise DataError(f"inner_dirichlet: at alpha {alpha} client {i}'s label mix puts all "
                        "its weight on classes already used up; use a larger alpha")
      c = rng.choice(num_classes, p=priors[i])
      if left_in_class[c] == 0:
        priors[:, c] = 0
        with np.errstate(invalid="ignore", divide="ignore"):
          priors = priors / priors.sum(axis=1, keepdims=True)
        continue
      left_in_class[c] -= 1
      taken[i].append(pools[c][left_in_class[c]])
      break
  return [np.array(t, np.int64) for t in taken]


def _assigned_classes(k, num_classes, per_client, mode, rng):
  """Each client's class numbers (into the sorted classes), Flower's draws."""
  if mode == "deterministic":
    return [[(i + j) % num_classes for j in range(per_client)] for i in range(k)]
  if mode == "random":
    return [rng.choice(num_classes, size=per_client, replace=False).tolist() for _ in range(k)]
  held = []
  for i in range(k):
    mine = [i % num_classes]
    while len(mine) < per_client:
      c = int(rng.choice(num_classes, size=1)[0])
      if c not in mine:
        mine.append(c)
    held.append(mine)
  return held


def _pathological(y, k, per_client, mode, rng):
  """k position arrays into y [n]: PathologicalPartitioner's split."""
  classes = np.unique(y)
  if per_client > len(classes):
    raise DataError(f"classes_per_client = {per_client}: the training set has "
                    f"{len(classes)} classes (allowed: 1..{len(classes)})")
  held = _assigned_classes(k, len(classes), per_client, mode, rng)
  holders = [[i for i in range(k) if c in held[i]] for c in range(len(classes))]
  unused = [classes[c].item() for c in range(len(classes)) if not holders[c]]
  if unused:
    raise DataError(f"pathological: class_assignment {mode!r} gives classes {unused} to no "
                    f"client of {k} (their examples would be left out); use more clients or "
                    "classes_per_client, or class_assignment 'first_deterministic' (every "
                    "class held when num_clients >= the classes)")
  parts = [[] for _ in range(k)]
  for c, ids in enumerate(holders):
    rows = np.flatnonzero(y == classes[c])
    if len(ids) > len(rows):
      raise DataError(f"pathological: class {classes[c].item()} has {len(rows)} examples "
                      f"for {len(ids)} clients; use fewer clients or classes_per_client, or "
                      "class_assignment 'deterministic'")
    for i, piece in zip(ids, np.array_split(rows, len(ids))):
      parts[i].append(piece)
  return [np.concatenate(p) for p in parts]


def _shard_plan(n, k, per_client, shard_size, keep_incomplete):
  """(shard size, usable shards, shards per client [k]): Flower's arithmetic."""
  if per_client is not None:
    used = k * per_client
    if shard_size is None:
      if used > n:
        raise DataError(f"shards_per_client = {per_client}: {k} clients need {used} shards "
                        f"of >= 1 example; the training set has {n}")
      shard_size = int(n / used)
      usable = math.ceil(n / shard_size) if keep_incomplete else math.floor(n / shard_size)
    else:
      if shard_size * used > n:
        raise DataError(f"shard_size = {shard_size}: {k} clients x shards_per_client "
                        f"{per_client} shards need {shard_size * used} examples; the "
                        f"training set has {n}")
      usable = math.floor(n / shard_size)
    return shard_size, usable, np.full(k, per_client, np.int64)
  if shard_size is None:
    raise DataError("partition 'shard' needs shards_per_client or shard_size (both are null)")
  usable = math.ceil(n / shard_size) if keep_incomplete else math.floor(n / shard_size)
  counts = np.full(k, int(usable / k), np.int64)
  counts[:usable - k * int(usable / k)] += 1
  return shard_size, usable, counts


def _shard(y, k, per_client, shard_size, keep_incomplete, rng):
  """k position arrays into y [n] (together maybe fewer than n): ShardPartitioner's."""
  n = len(y)
  size, usable, counts = _shard_plan(n, k, per_client, shard_size, keep_incomplete)
  if usable < k:
    raise DataError(f"shard: {usable} shards of {size} examples for {k} clients (some would "
                    "be empty); use a smaller shard_size or fewer clients")
  by_label = np.argsort(y, kind="stable")   # Dataset.sort: a stable sort
  shards = np.split(rng.permutation(usable)[:int(counts.sum())], np.cumsum(counts)[:-1])
  return [np.concatenate([by_label[s * size:min((s + 1) * size, n)] for s in ids])
          for ids in shards]


_SIZE_UNITS = {"linear": lambda x: x, "square": np.square, "exponential": np.exp}


def _grown_sizes(n, k, method):
  """int64 [k]: IdToSizeFncPartitioner's sizes, f(1..k) normalised to n rows."""
  with np.errstate(over="ignore", invalid="ignore"):
    units = _SIZE_UNITS[method](np.linspace(1, k, k))
    sizes = np.array(units / units.sum() * n, dtype=np.int64) if np.isfinite(
        units.sum()) else np.zeros(k, np.int64)
  sizes[-1] += n - sizes.sum()
  return sizes


def _by_size(n, k, method):
  """k consecutive position ranges covering 0..n-1, of the grown sizes."""
  sizes = _grown_sizes(n, k, method)
  if sizes.min() < 1:
    most = max([m for m in range(1, k) if _grown_sizes(n, m, method).min() >= 1], default=0)
    raise DataError(f"partition {method!r}: num_clients = {k} gives client 0 no examples of "
                    f"{n} (sizes grow as f(client id)); allowed: num_clients <= {most}")
  return np.split(np.arange(n), np.cumsum(sizes)[:-1])


FLWR_PARTITIONS = ("flwr_dirichlet", "inner_dirichlet", "pathological", "shard", "linear",
                   "square", "exponential")


def flwr_partition(labels: np.ndarray, k: int, method: str, seed: int, *, alpha: float,
                   classes_per_client: int, min_partition_size: int, self_balancing: bool,
                   client_sizes, class_assignment: str, shards_per_client: int | None,
                   shard_size: int | None, keep_incomplete_shard: bool) -> list[np.ndarray]:
  """One row-index array per client (unsorted) of labels [n], as Flower's partitioner
  `method` on the rows shuffled by seed (the module docstring)."""
  n = len(labels)
  order = np.random.default_rng(seed).permutation(n)   # FederatedDataset's shuffle
  y = labels[order]
  rng = np.random.default_rng(seed)   # the partitioner's own generator
  if method == "flwr_dirichlet":
    if min_partition_size < 1:
      raise DataError(f"min_partition_size = {min_partition_size}: must be >= 1")
    parts = _flwr_dirichlet(y, k, alpha, min_partition_size, self_balancing, rng)
  elif method == "inner_dirichlet":
    parts = _inner_dirichlet(y, _client_sizes(client_sizes, k, n), alpha, rng)
  elif method == "pathological":
    if class_assignment not in CLASS_ASSIGNMENTS:
      raise DataError(f"class_assignment = {class_assignment!r}: allowed are "
                      f"{', '.join(CLASS_ASSIGNMENTS)}")
    if classes_per_client < 1:
      raise DataError(f"classes_per_client = {classes_per_client}: must be >= 1")
    parts = _pathological(y, k, classes_per_client, class_assignment, rng)
  elif method == "shard":
    for name, v in (("shards_per_client", shards_per_client), ("shard_size", shard_size)):
      if v is not None and v < 1:
        raise DataError(f"{name} = {v}: must be >= 1 or null")
    parts = _shard(y, k, shards_per_client, shard_size, keep_incomplete_shard, rng)
  else:
    parts = _by_size(n, k, method)
  return [order[p] for p in parts]
