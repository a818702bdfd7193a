"""Partition invariants: exact cover, determinism, skew ordering, shards, histograms."""

import numpy as np
import pytest

from fedjax_dp.errors import DataError
from fedjax_dp.data.flwr_partitions import FLWR_PARTITIONS
from fedjax_dp.data.partition import PARTITIONS, format_histogram, label_histogram, partition

LABELS = np.random.default_rng(0).integers(0, 10, 3000)
# Flower's methods, whose options and limits differ, have tests/test_flwr_partitions.py
OURS = tuple(m for m in PARTITIONS if m not in FLWR_PARTITIONS)


@pytest.mark.parametrize("method", OURS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_example_in_exactly_one_client(method, seed):
  parts = partition(LABELS, 37, method, alpha=0.3, seed=seed)
  assert len(parts) == 37 and min(len(p) for p in parts) >= 1
  np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(LABELS)))


@pytest.mark.parametrize("method", OURS)
def test_deterministic_by_seed(method):
  a = partition(LABELS, 20, method, seed=5)
  b = partition(LABELS, 20, method, seed=5)
  c = partition(LABELS, 20, method, seed=6)
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def skew(labels, parts):
  """Mean total-variation distance of client label distributions from the global one."""
  hist = label_histogram(labels, parts, 10).astype(float)
  local = hist / hist.sum(1, keepdims=True)
  glob = np.bincount(labels, minlength=10) / len(labels)
  return float(np.mean(0.5 * np.abs(local - glob).sum(1)))


def test_smaller_alpha_more_skew():
  s = {a: skew(LABELS, partition(LABELS, 30, "dirichlet", alpha=a, seed=0))
       for a in (0.05, 0.5, 100.0)}
  assert s[0.05] > s[0.5] + 0.1 > s[100.0] + 0.2
  assert s[100.0] < skew(LABELS, partition(LABELS, 30, "shards", seed=0))


def test_shards_give_at_most_k_classes():
  labels = np.repeat(np.arange(10), 100)
  parts = partition(labels, 50, "shards", classes_per_client=2, seed=0)
  assert max(len(np.unique(labels[p])) for p in parts) <= 2


def test_quantity_skew_keeps_labels_iid_and_sizes_vary():
  parts = partition(LABELS, 20, "quantity", quantity_alpha=0.5, seed=0)
  sizes = np.array([len(p) for p in parts])
  assert sizes.max() > 3 * sizes.min()
  assert skew(LABELS, [p for p in parts if len(p) > 100]) < 0.1


def test_histogram_equals_a_plain_count():
  parts = partition(LABELS, 7, "dirichlet", alpha=0.5, seed=1)
  hist = label_histogram(LABELS, parts, 10)
  for i, p in enumerate(parts):
    for c in range(10):
      assert hist[i, c] == sum(1 for j in p if LABELS[j] == c)
  text = format_histogram(hist)
  assert text.splitlines()[0].startswith("client") and "client sizes" in text


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(num_clients=5, method="random"), "unknown partition 'random'"),
    (dict(num_clients=5, method="dirichlet", alpha=0.0), "alpha = 0.0"),
    (dict(num_clients=4000, method="iid"), "4000 clients need at least 4000 examples"),
])
def test_bad_arguments(kwargs, fragment):
  with pytest.raises(DataError, match=fragment):
    partition(LABELS, **kwargs)
