"""Our Flower-style partitions against flwr-datasets 0.6.1 itself: the same row sets.

Optional: skipped where flwr_datasets is not installed. `make test-flwr` makes
.venv-flwr with it and runs this file there. Flower's partitioner gets the labels
as a Hugging Face dataset shuffled as FederatedDataset shuffles it (Dataset.shuffle
with the seed) and the same seed; an "idx" column carries each row's index into
the labels, so its partitions (of the shuffled, and for ShardPartitioner sorted,
rows) compare with ours as index sets.
"""

import numpy as np
import pytest

flwr_partitioner = pytest.importorskip("flwr_datasets.partitioner")
datasets = pytest.importorskip("datasets")

from fedjax_dp.data.partition import partition  # noqa: E402
from fedjax_dp.errors import DataError  # noqa: E402

# uneven classes, one much rarer, in a random order; and a label-sorted set
LABELS = {"random": np.random.default_rng(3).choice(10, 1797, p=[.05] + [.95 / 9] * 9),
          "sorted": np.repeat(np.arange(6), [50, 80, 120, 60, 90, 40])}


def flower_sets(partitioner, labels, seed):
  ds = datasets.Dataset.from_dict({"label": labels.tolist(),
                                   "idx": list(range(len(labels)))}).shuffle(seed=seed)
  partitioner.dataset = ds
  return [sorted(partitioner.load_partition(i)["idx"]) for i in range(partitioner.num_partitions)]


def assert_same(labels, seed, partitioner, k, method, **options):
  """The same row sets, or both refuse (ours a DataError, Flower's a ValueError)."""
  try:
    ours = partition(labels, k, method, seed=seed, **options)
  except DataError:
    with pytest.raises(ValueError):
      flower_sets(partitioner, labels, seed)
    return
  theirs = flower_sets(partitioner, labels, seed)
  assert len(ours) == len(theirs) == k
  for i, (a, b) in enumerate(zip(ours, theirs)):
    assert a.tolist() == b, (method, options, seed, i, len(a), len(b))


P = flwr_partitioner
CASES = [   # (our method, our options, Flower's partitioner, clients)
    ("iid", {}, lambda k, s: P.IidPartitioner(k), 13),
    ("flwr_dirichlet", dict(alpha=0.5, min_partition_size=5),
     lambda k, s: P.DirichletPartitioner(k, "label", 0.5, min_partition_size=5, seed=s), 12),
    ("flwr_dirichlet", dict(alpha=0.3, min_partition_size=1, self_balancing=True),
     lambda k, s: P.DirichletPartitioner(k, "label", 0.3, min_partition_size=1,
                                         self_balancing=True, seed=s), 9),
    ("flwr_dirichlet", dict(alpha=2.0, min_partition_size=10, self_balancing=True),
     lambda k, s: P.DirichletPartitioner(k, "label", 2.0, self_balancing=True, seed=s), 20),
    ("pathological", dict(classes_per_client=2, class_assignment="first_deterministic"),
     lambda k, s: P.PathologicalPartitioner(k, "label", 2, "first-deterministic", seed=s), 14),
    ("pathological", dict(classes_per_client=3, class_assignment="deterministic"),
     lambda k, s: P.PathologicalPartitioner(k, "label", 3, "deterministic", seed=s), 12),
    ("shard", dict(shards_per_client=2),
     lambda k, s: P.ShardPartitioner(k, "label", num_shards_per_partition=2, seed=s), 10),
    ("shard", dict(shards_per_client=3, keep_incomplete_shard=True),
     lambda k, s: P.ShardPartitioner(k, "label", num_shards_per_partition=3,
                                     keep_incomplete_shard=True, seed=s), 7),
    ("shard", dict(shards_per_client=2, shard_size=20),
     lambda k, s: P.ShardPartitioner(k, "label", 2, 20, seed=s), 8),
    ("shard", dict(shards_per_client=None, shard_size=37),
     lambda k, s: P.ShardPartitioner(k, "label", None, 37, seed=s), 9),
    ("shard", dict(shards_per_client=None, shard_size=37, keep_incomplete_shard=True),
     lambda k, s: P.ShardPartitioner(k, "label", None, 37, True, seed=s), 9),
    ("linear", {}, lambda k, s: P.LinearPartitioner(k), 11),
    ("square", {}, lambda k, s: P.SquarePartitioner(k), 8),
    ("exponential", {}, lambda k, s: P.ExponentialPartitioner(k), 5),
]


@pytest.mark.parametrize("data", sorted(LABELS))
@pytest.mark.parametrize("seed", [42, 7])
@pytest.mark.parametrize("case", range(len(CASES)), ids=lambda c: f"{CASES[c][0]}-{c}")
def test_the_same_row_sets_as_flower(case, seed, data):
  method, options, make, k = CASES[case]
  assert_same(LABELS[data], seed, make(k, seed), k, method, **options)


@pytest.mark.parametrize("seed", [42, 0, 5])
def test_random_pathological_and_inner_dirichlet_as_flower(seed):
  """Random class assignment on few classes with many clients (so every class is
  held, which ours requires), and inner Dirichlet with given and equal sizes."""
  labels = LABELS["random"]
  assert_same(labels, seed, P.PathologicalPartitioner(30, "label", 3, seed=seed), 30,
              "pathological", classes_per_client=3, class_assignment="random")
  sizes = [100] * 10 + [797]
  assert_same(labels, seed, P.InnerDirichletPartitioner(sizes, "label", 0.5, seed=seed), 11,
              "inner_dirichlet", alpha=0.5, client_sizes=sizes)
  equal = [len(p) for p in np.array_split(np.arange(len(labels)), 16)]
  assert_same(labels, seed, P.InnerDirichletPartitioner(equal, "label", 0.1, seed=seed), 16,
              "inner_dirichlet", alpha=0.1)


@pytest.mark.parametrize("method,options,make,k", [
    ("flwr_dirichlet", dict(alpha=0.05, min_partition_size=30),
     lambda k: P.DirichletPartitioner(k, "label", 0.05, min_partition_size=30, seed=42), 12),
    ("pathological", dict(classes_per_client=7),
     lambda k: P.PathologicalPartitioner(k, "label", 7, seed=42), 4),
    ("shard", dict(shards_per_client=2, shard_size=30),
     lambda k: P.ShardPartitioner(k, "label", 2, 30, seed=42), 8),
    ("exponential", {}, lambda k: P.ExponentialPartitioner(k), 9),
])
def test_where_flower_refuses_so_do_we(method, options, make, k):
  labels = LABELS["sorted"]
  with pytest.raises(DataError):
    partition(labels, k, method, seed=42, **options)
  with pytest.raises(ValueError):
    flower_sets(make(k), labels, 42)
