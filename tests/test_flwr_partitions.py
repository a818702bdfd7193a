"""Flower's partitioners (data/flwr_partitions.py) against references of their own:
closed-form sizes, label counts, exact cover, determinism, the refusals; and their
config keys. The same row sets as flwr-datasets itself: test_flwr_datasets_match.py
(`make test-flwr`)."""

import hashlib
from fractions import Fraction
import math

import numpy as np
import pytest

from fedjax_dp.config.schema import CHOICES, Config
from fedjax_dp.data.flwr_partitions import FLWR_PARTITIONS
from fedjax_dp.data.partition import PARTITION_KEYS, PARTITIONS, partition
from fedjax_dp.errors import DataError
from fedjax_dp.recipes.config_checks import read_condition
from fedjax_dp.recipes.release_identity import LATER_KEYS

LABELS = np.random.default_rng(0).integers(0, 10, 3000)
# options under which each method covers every example (shard: shards of every row)
COVERING = {"flwr_dirichlet": dict(alpha=0.5, min_partition_size=5),
            "inner_dirichlet": dict(alpha=0.3), "pathological": dict(classes_per_client=3),
            "shard": dict(shards_per_client=None, shard_size=45, keep_incomplete_shard=True),
            "linear": {}, "square": {}, "exponential": {}}


def clients(method):
  return {"exponential": 7, "square": 15}.get(method, 23)


def rows_of_seed(n, seed):
  """The shuffled order every Flower method partitions (FederatedDataset's)."""
  return np.random.default_rng(seed).permutation(n)


@pytest.mark.parametrize("method", FLWR_PARTITIONS)
@pytest.mark.parametrize("seed", [0, 3])
def test_every_example_in_exactly_one_client(method, seed):
  parts = partition(LABELS, clients(method), method, seed=seed, **COVERING[method])
  assert len(parts) == clients(method) and min(len(p) for p in parts) >= 1
  assert all(p.dtype == np.int64 and np.all(np.diff(p) > 0) for p in parts)
  np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(LABELS)))


@pytest.mark.parametrize("method", FLWR_PARTITIONS)
def test_deterministic_by_seed(method):
  a, b, c = (partition(LABELS, clients(method), method, seed=s, **COVERING[method])
             for s in (5, 5, 6))
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_the_old_methods_are_unchanged():
  """The five methods before Flower's, bit for bit (golden results rest on them)."""
  pins = {"iid": "762b0daade13a3a4", "dirichlet": "ef802ccb978a4a3e",
          "shards": "e0ced6a311378587", "quantity": "0afbd27c0b88a136",
          "dirichlet_client": "992b37b70beb31a8"}
  for method, pin in pins.items():
    parts = partition(LABELS, 37, method, alpha=0.3, classes_per_client=3, quantity_alpha=0.7)
    h = hashlib.sha256()
    for p in parts:
      h.update(p.tobytes() + b"|")
    assert h.hexdigest()[:16] == pin, method


def units(method, i):
  return {"linear": Fraction(i), "square": Fraction(i * i), "exponential": math.exp(i)}[method]


@pytest.mark.parametrize("method,k", [("linear", 10), ("square", 9), ("exponential", 7)])
@pytest.mark.parametrize("n", [1797, 3000, 101])
def test_grown_sizes_are_the_closed_form_of_consecutive_shuffled_rows(method, k, n):
  """Client i (from 1) gets floor(n f(i) / sum f), the last also the rest, as
  consecutive rows of the seed's shuffle."""
  total = sum(units(method, i) for i in range(1, k + 1))
  want = [math.floor(n * units(method, i) / total) for i in range(1, k + 1)]
  want[-1] += n - sum(want)
  if min(want) < 1:
    with pytest.raises(DataError, match=f"num_clients = {k} gives client 0 no examples"):
      partition(np.zeros(n, int), k, method, seed=2)
    return
  parts = partition(np.zeros(n, int), k, method, seed=2)
  assert [len(p) for p in parts] == want
  bounds = np.cumsum([0] + want)
  order = rows_of_seed(n, 2)
  for i, p in enumerate(parts):
    np.testing.assert_array_equal(p, np.sort(order[bounds[i]:bounds[i + 1]]))


def test_pathological_gives_each_client_its_classes_in_near_equal_shares():
  labels = np.repeat(np.arange(6), [50, 80, 120, 60, 90, 40])
  for mode in ("random", "deterministic", "first_deterministic"):
    parts = partition(labels, 12, "pathological", classes_per_client=3, class_assignment=mode,
                      seed=1)
    held = [set(labels[p].tolist()) for p in parts]
    assert all(len(h) == 3 for h in held), mode
    if mode == "deterministic":
      assert held == [{i % 6, (i + 1) % 6, (i + 2) % 6} for i in range(12)]
    if mode == "first_deterministic":
      assert all(i % 6 in h for i, h in enumerate(held))
    for c in range(6):   # a class's rows split near-equally among its holders
      counts = [int(np.sum(labels[p] == c)) for p, h in zip(parts, held) if c in h]
      assert sum(counts) == np.sum(labels == c) and max(counts) - min(counts) <= 1


def test_shard_gives_whole_shards_and_leaves_out_what_flower_leaves_out():
  labels = np.repeat(np.arange(10), 100)   # shards of 50: one class each
  parts = partition(labels, 10, "shard", shards_per_client=2, seed=0)
  assert [len(p) for p in parts] == [100] * 10
  assert all(len(np.unique(labels[p])) <= 2 for p in parts)
  # 1797 rows, 40 shards: int(1797 / 40) = 44 rows each, 1760 used, 37 in no client
  parts = partition(np.repeat(np.arange(10), 180)[:1797], 20, "shard", seed=0)
  used = np.concatenate(parts)
  assert len(used) == len(np.unique(used)) == 40 * 44
  # shard_size only: floor(1797 / 45) = 39 shards, the first 19 clients 2, the last 1
  parts = partition(LABELS[:1797], 20, "shard", shards_per_client=None, shard_size=45, seed=0)
  assert [len(p) for p in parts] == [90] * 19 + [45]


def test_shard_rows_are_runs_of_the_label_sorted_shuffle():
  n, size = 600, 30
  labels = LABELS[:n]
  parts = partition(labels, 4, "shard", shards_per_client=5, shard_size=size, seed=4)
  order = rows_of_seed(n, 4)
  by_label = order[np.argsort(labels[order], kind="stable")]
  shards = {tuple(np.sort(by_label[s:s + size])) for s in range(0, n, size)}
  for p in parts:
    pieces = [tuple(sorted(s)) for s in shards if set(s) <= set(p.tolist())]
    assert len(pieces) == 5 and sum(len(s) for s in pieces) == len(p)


def test_inner_dirichlet_keeps_the_given_sizes_and_skews_labels_by_alpha():
  sizes = [100] * 20 + [1000]
  parts = partition(LABELS, 21, "inner_dirichlet", client_sizes=sizes, alpha=0.1, seed=0)
  assert [len(p) for p in parts] == sizes
  def classes_held(alpha):
    parts = partition(LABELS, 30, "inner_dirichlet", alpha=alpha, seed=0)
    return np.mean([np.sum(np.bincount(LABELS[p], minlength=10) >= 5) for p in parts])
  assert classes_held(0.05) + 3 < classes_held(100.0)


def test_flwr_dirichlet_meets_its_minimum_and_balancing_evens_sizes():
  for balancing in (False, True):
    parts = partition(LABELS, 30, "flwr_dirichlet", alpha=0.2, min_partition_size=20,
                      self_balancing=balancing, seed=0)
    assert min(len(p) for p in parts) >= 20
  spread = {b: np.std([len(p) for p in partition(LABELS, 30, "flwr_dirichlet", alpha=0.5,
                                                  self_balancing=b, seed=0)])
            for b in (False, True)}
  assert spread[True] < spread[False]


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(method="inner_dirichlet", client_sizes=[1000, 1000, 999]),
     r"client_sizes = \[1000, 1000, 999\] sum to 2999: they must sum to the training set's "
     "3000"),
    (dict(method="inner_dirichlet", client_sizes=[1500, 1500, 0]),
     r"needs num_clients = 3 integers >= 1"),
    (dict(method="inner_dirichlet", num_clients=2, client_sizes=[1000, 1000, 1000]),
     r"needs num_clients = 2 integers"),
    (dict(method="pathological", classes_per_client=11),
     r"classes_per_client = 11: the training set has 10 classes \(allowed: 1..10\)"),
    (dict(method="pathological", class_assignment="first-deterministic"),
     r"class_assignment = 'first-deterministic': allowed are random, deterministic, "
     "first_deterministic"),
    (dict(method="pathological", num_clients=2, class_assignment="deterministic"),
     r"gives classes \[3, 4, 5, 6, 7, 8, 9\] to no client of 2"),
    (dict(method="flwr_dirichlet", min_partition_size=0), "min_partition_size = 0: must be >= 1"),
    (dict(method="flwr_dirichlet", num_clients=100, alpha=0.01, min_partition_size=20),
     "no draw in 11 gave every one of 100 clients >= min_partition_size 20"),
    (dict(method="shard", shards_per_client=None), "needs shards_per_client or shard_size"),
    (dict(method="shard", shard_size=0), "shard_size = 0: must be >= 1 or null"),
    (dict(method="shard", shards_per_client=2, shard_size=501),
     "shard_size = 501: 3 clients x shards_per_client 2 shards need 3006 examples"),
    (dict(method="shard", num_clients=40, shards_per_client=None, shard_size=100),
     "shard: 30 shards of 100 examples for 40 clients"),
    (dict(method="exponential", num_clients=20),
     r"num_clients = 20 gives client 0 no examples of 3000 .*allowed: num_clients <= 8"),
])
def test_bad_values_are_refused_in_one_line(kwargs, fragment):
  kwargs = {"num_clients": 3, **kwargs}
  with pytest.raises(DataError, match=fragment) as err:
    partition(LABELS, seed=0, **kwargs)
  assert "\n" not in str(err.value)


def test_every_method_is_a_config_choice_and_every_option_a_key_at_its_default():
  """PARTITIONS is the list (config/keys.py copies it); partition()'s options are keys
  with partition()'s defaults, left out of old runs' digests at them (LATER_KEYS),
  and refused where their partition does not read them."""
  import inspect
  assert set(PARTITIONS) <= set(CHOICES["partition"])
  assert set(FLWR_PARTITIONS) <= set(PARTITIONS)
  defaults = {k: p.default for k, p in inspect.signature(partition).parameters.items()}
  for key in PARTITION_KEYS:
    assert getattr(Config(), key) == defaults[key], key
  for key in PARTITION_KEYS[3:]:   # the keys Flower's methods added
    assert LATER_KEYS[key] == defaults[key], key
    assert read_condition(key).startswith("partition '"), key


@pytest.mark.parametrize("overrides,fragment", [
    ({"partition": "iid", "shard_size": 40}, "'shard_size' = 40 is read by nothing in this "
     "run: it is read with partition 'shard'"),
    ({"partition": "dirichlet", "self_balancing": True}, "partition 'flwr_dirichlet'"),
    ({"partition": "shard", "shard_size": 40, "keep_incomplete_shard": True},
     "partition 'shard' without both shards_per_client and shard_size"),
    ({"partition": "pathological", "class_assignment": "first-deterministic"},
     "allowed values are random, deterministic, first_deterministic"),
])
def test_a_key_its_partition_does_not_read_is_refused(overrides, fragment):
  from fedjax_dp import make_config
  from fedjax_dp.errors import ConfigError
  with pytest.raises(ConfigError, match=fragment):
    make_config(overrides)
  make_config({"partition": "shard", "shards_per_client": None, "shard_size": 40,
               "keep_incomplete_shard": True})
