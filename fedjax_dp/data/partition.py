"""Partitioners: split a training set's example indices over clients, deterministically by seed.

Every partition puts every example in exactly one client (`shard` in at most one)
and gives every client at least `min_size` examples.

  iid        shuffle, then near-equal parts
  dirichlet  label skew: for each class, client shares ~ Dir(alpha * 1) split that
             class's examples (Yurochkin et al. 2019; Hsu et al. 2019). Smaller
             alpha, more skew; client sizes differ.
  shards     sort by label, cut into num_clients * classes_per_client shards and
             deal classes_per_client shards to each client (McMahan et al. 2017)
  quantity   IID labels, client sizes ~ Dir(quantity_alpha * 1) (quantity skew)
  dirichlet_client  label skew per client: client i's label mix p_i ~ Dir(alpha * 1_K)
             over the K classes, near-equal sizes; a client's draws come from what
             is left of each class (a class that runs out passes its draws to the
             class with most left). Works at any alpha with few classes, where
             `dirichlet` leaves clients empty (the dynamic-DP paper's 3-class
             tabular data with 120 clients at alpha 0.01..1)

Flower's partitioners (flwr-datasets 0.6.1: the same row sets from the same seed;
flwr_partitions.py says how): flwr_dirichlet, inner_dirichlet, pathological, shard,
linear, square, exponential. `iid` is Flower's IidPartitioner on its shuffled rows.
"""

from __future__ import annotations

import numpy as np

from fedjax_dp.data.flwr_partitions import FLWR_PARTITIONS, flwr_partition, split_by_shares
from fedjax_dp.errors import DataError

# the one list of names (config/keys.py's choices for `partition` copy it: config/ imports
# nothing of the package; tests/test_flwr_partitions.py checks each is there)
PARTITIONS = ("iid", "dirichlet", "shards", "quantity", "dirichlet_client", "flwr_dirichlet",
              "inner_dirichlet", "pathological", "shard", "linear", "square", "exponential")
# partition()'s options that are config keys of the same name (the set-up passes them)
PARTITION_KEYS = ("alpha", "classes_per_client", "quantity_alpha", "min_partition_size",
                  "self_balancing", "client_sizes", "class_assignment", "shards_per_client",
                  "shard_size", "keep_incomplete_shard")
# the ones that read no label (the rest split by class: labels [n] needed)
LABEL_FREE = ("iid", "quantity", "linear", "square", "exponential")
_MAX_TRIES = 1000


def _dirichlet(labels, num_clients, alpha, rng, min_size):
  classes = np.unique(labels)
  for _ in range(_MAX_TRIES):
    parts = [[] for _ in range(num_clients)]
    for k in classes:
      idx = rng.permutation(np.flatnonzero(labels == k))
      for i, piece in enumerate(split_by_shares(idx, rng.dirichlet([alpha] * num_clients))):
        parts[i].append(piece)
    parts = [np.concatenate(p) for p in parts]
    if min(len(p) for p in parts) >= min_size:
      return parts
  raise DataError(f"dirichlet partition: no draw in {_MAX_TRIES} gave every one of "
                  f"{num_clients} clients >= {min_size} examples at alpha {alpha}; use fewer "
                  "clients or a larger alpha")


def _dirichlet_client(labels, num_clients, alpha, rng):
  classes = np.unique(labels)
  pools = [list(rng.permutation(np.flatnonzero(labels == k))) for k in classes]
  sizes = [len(p) for p in np.array_split(np.arange(len(labels)), num_clients)]
  parts = []
  for i in rng.permutation(num_clients):
    want = rng.multinomial(sizes[i], rng.dirichlet([alpha] * len(classes)))
    taken = []
    for k in np.argsort(-want):
      take = min(int(want[k]), len(pools[k]))
      taken += pools[k][:take]
      del pools[k][:take]
      short = int(want[k]) - take
      while short > 0:   # this class ran out: the rest from the fullest class
        j = int(np.argmax([len(p) for p in pools]))
        more = min(short, len(pools[j]))
        taken += pools[j][:more]
        del pools[j][:more]
        short -= more
    parts.append((i, np.array(taken, np.int64)))
  return [p for _, p in sorted(parts, key=lambda t: t[0])]


def _quantity(n, num_clients, quantity_alpha, rng, min_size):
  spare = n - num_clients * min_size
  perm = rng.permutation(n)
  shares = rng.dirichlet([quantity_alpha] * num_clients)
  extra = np.floor(shares * spare).astype(np.int64)
  extra[np.argsort(-(shares * spare - extra))[:spare - extra.sum()]] += 1  # largest remainders
  sizes = extra + min_size
  return np.split(perm, np.cumsum(sizes)[:-1])


def _shards(labels, num_clients, classes_per_client, rng):
  order = np.argsort(labels, kind="stable")
  # shuffle within each label so shards of one class are random subsets of it
  order = np.concatenate([rng.permutation(order[labels[order] == k]) for k in np.unique(labels)])
  shards = np.array_split(order, num_clients * classes_per_client)
  deal = rng.permutation(len(shards)).reshape(num_clients, classes_per_client)
  return [np.concatenate([shards[s] for s in row]) for row in deal]


def partition(labels: np.ndarray, num_clients: int, method: str, *, alpha: float = 0.5,
              classes_per_client: int = 2, quantity_alpha: float = 1.0, seed: int = 0,
              min_size: int = 1, min_partition_size: int = 10, self_balancing: bool = False,
              client_sizes=None, class_assignment: str = "random",
              shards_per_client: int | None = 2, shard_size: int | None = None,
              keep_incomplete_shard: bool = False) -> list[np.ndarray]:
  """Returns one int64 index array per client (each sorted ascending) of labels [n].

  The options after min_size are read by Flower's methods only (flwr_partitions.py)."""
  labels = np.asarray(labels)
  n = len(labels)
  if method not in PARTITIONS:
    raise DataError(f"unknown partition {method!r} (allowed: {', '.join(PARTITIONS)})")
  if num_clients < 1:
    raise DataError(f"num_clients = {num_clients}: must be >= 1")
  if labels.ndim != 1 and method not in LABEL_FREE:
    raise DataError(f"partition {method!r} splits by class, and the targets are "
                    f"{labels.shape[1:]} per example (token sequences or vectors, not one "
                    f"label): allowed are {', '.join(LABEL_FREE)} (or natural_id for a "
                    "dataset's own clients)")
  if num_clients * min_size > n:
    raise DataError(f"{num_clients} clients need at least {num_clients * min_size} examples; "
                    f"the training set has {n}")
  if alpha <= 0:
    raise DataError(f"alpha = {alpha}: must be > 0")
  if quantity_alpha <= 0:
    raise DataError(f"quantity_alpha = {quantity_alpha}: must be > 0")
  if method == "shards" and (classes_per_client < 1 or num_clients * classes_per_client > n):
    raise DataError(f"classes_per_client = {classes_per_client}: shards needs >= 1 with "
                    f"num_clients * classes_per_client <= {n} examples")
  if method in FLWR_PARTITIONS:
    parts = flwr_partition(
        labels, num_clients, method, seed, alpha=alpha, classes_per_client=classes_per_client,
        min_partition_size=min_partition_size, self_balancing=self_balancing,
        client_sizes=client_sizes, class_assignment=class_assignment,
        shards_per_client=shards_per_client, shard_size=shard_size,
        keep_incomplete_shard=keep_incomplete_shard)
    if min(len(p) for p in parts) < min_size:
      raise DataError(f"partition {method!r} gives a client {min(len(p) for p in parts)} "
                      f"examples; at least min_size = {min_size} are needed")
    return [np.sort(p).astype(np.int64) for p in parts]
  rng = np.random.default_rng(seed)
  if method == "iid":
    parts = np.array_split(rng.permutation(n), num_clients)
  elif method == "dirichlet":
    parts = _dirichlet(labels, num_clients, alpha, rng, min_size)
  elif method == "dirichlet_client":
    parts = _dirichlet_client(labels, num_clients, alpha, rng)
  elif method == "shards":
    parts = _shards(labels, num_clients, classes_per_client, rng)
  else:
    parts = _quantity(n, num_clients, quantity_alpha, rng, min_size)
  return [np.sort(p).astype(np.int64) for p in parts]


def label_histogram(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
  """int64 [clients, classes]: examples of each class held by each client."""
  labels = np.asarray(labels)
  return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])


def format_sequence_sizes(parts: list[np.ndarray], shape: tuple[int, ...]) -> str:
  """The clients' sizes where the targets are token sequences (no labels to count)."""
  sizes = np.array([len(p) for p in parts])
  return (f"client sizes (sequences): min {sizes.min()}, median {int(np.median(sizes))}, max "
          f"{sizes.max()}; targets are token sequences {tuple(shape)} (no labels)")


def format_histogram(hist: np.ndarray, max_rows: int = 20) -> str:
  """A text table, one row per client (the first `max_rows`), plus totals."""
  k = hist.shape[1]
  width = max(5, len(str(int(hist.max(initial=0)))) + 1)
  head = "client " + "".join(f"{c:>{width}}" for c in range(k)) + f"{'total':>{width + 2}}"
  lines = [head]
  for i, row in enumerate(hist[:max_rows]):
    lines.append(f"{i:>6} " + "".join(f"{v:>{width}}" for v in row) + f"{row.sum():>{width + 2}}")
  if len(hist) > max_rows:
    lines.append(f"... {len(hist) - max_rows} more clients")
  sizes = hist.sum(1)
  lines.append(f"client sizes: min {sizes.min()}, median {int(np.median(sizes))}, max "
               f"{sizes.max()}; classes per client (non-empty): mean {(hist > 0).sum(1).mean():.2f}")
  return "\n".join(lines)


def plot_histogram(hist: np.ndarray, path: str, class_names=None, title: str | None = None
                   ) -> list[str]:
  """Stacked bars: one bar per client, one colour per class, the legend in
  `class_names` where given (else class numbers); returns the legend's labels."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(max(5.0, min(16.0, 0.12 * len(hist) + 3)), 3.6), dpi=120)
  bottom = np.zeros(len(hist))
  cmap = plt.get_cmap("tab10" if hist.shape[1] <= 10 else "tab20")
  for c in range(hist.shape[1]):
    ax.bar(np.arange(len(hist)), hist[:, c], bottom=bottom, width=0.9, color=cmap(c % cmap.N),
           label=class_names[c] if class_names is not None else str(c))
    bottom += hist[:, c]
  ax.set_xlabel("client")
  ax.set_ylabel("examples")
  if title:
    ax.set_title(title, fontsize=9)
  labels = []
  if hist.shape[1] <= 20:
    legend = ax.legend(title="class", fontsize=6, ncol=2, loc="upper right")
    labels = [t.get_text() for t in legend.get_texts()]
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return labels
