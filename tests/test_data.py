"""Loaders read the real formats back exactly and reject broken files with one line."""

import gzip
import os
import pickle

import numpy as np
import pytest

from fedjax_dp.data import (DEBIAN_FMNIST, IMAGE_MAGIC, LABEL_MAGIC, find_dataset, load_dataset,
                            read_idx)
from fedjax_dp.errors import DataError


def write_idx(path, array, magic, gz=False, header_dims=None):
  dims = header_dims or array.shape
  raw = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in dims)
  raw += np.ascontiguousarray(array, np.uint8).tobytes()
  opener = gzip.open if gz else open
  with opener(str(path) + (".gz" if gz else ""), "wb") as f:
    f.write(raw)


def write_mnist_folder(folder, n_train=12, n_test=5, gz=True, seed=0):
  rng = np.random.default_rng(seed)
  arrays = {
      "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
      "train-labels-idx1-ubyte": rng.integers(0, 10, n_train),
      "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
      "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test),
  }
  os.makedirs(folder, exist_ok=True)
  for name, a in arrays.items():
    write_idx(os.path.join(folder, name), a, IMAGE_MAGIC if "images" in name else LABEL_MAGIC, gz)
  return arrays


@pytest.mark.parametrize("gz", [True, False])
def test_idx_round_trip(tmp_path, gz):
  arrays = write_mnist_folder(tmp_path, gz=gz)
  ds = load_dataset("mnist", str(tmp_path))
  assert ds.x_train.shape == (12, 28, 28, 1) and ds.x_test.shape == (5, 28, 28, 1)
  np.testing.assert_array_equal(ds.x_train[..., 0] * 255, arrays["train-images-idx3-ubyte"])
  np.testing.assert_array_equal(ds.y_test, arrays["t10k-labels-idx1-ubyte"])
  assert ds.y_train.dtype == np.int32 and ds.source == str(tmp_path)


def test_search_path_env_and_torchvision_layout(tmp_path, monkeypatch):
  write_mnist_folder(tmp_path / "FashionMNIST" / "raw")
  monkeypatch.setenv("FEDJAX_DP_DATA", str(tmp_path))
  ok, where = find_dataset("fmnist")
  assert ok and where == str(tmp_path / "FashionMNIST" / "raw")
  assert load_dataset("fmnist").x_train.shape[0] == 12


def _one_line_error(fn, *fragments):
  with pytest.raises(DataError) as e:
    fn()
  msg = str(e.value)
  assert "\n" not in msg
  for fragment in fragments:
    assert fragment in msg, msg
  return msg


def test_bad_magic(tmp_path):
  write_mnist_folder(tmp_path, gz=False)
  path = tmp_path / "train-images-idx3-ubyte"
  write_idx(path, np.zeros(10), LABEL_MAGIC)  # a label file where images belong
  _one_line_error(lambda: load_dataset("mnist", str(tmp_path)), str(path),
                  "bad IDX magic 0x00000801, expected 0x00000803")


def test_truncated_file(tmp_path):
  write_mnist_folder(tmp_path, gz=False)
  path = tmp_path / "t10k-images-idx3-ubyte"
  data = path.read_bytes()
  path.write_bytes(data[:-100])
  _one_line_error(lambda: read_idx(str(path), IMAGE_MAGIC), str(path), "truncated or corrupt")


def test_label_count_mismatch(tmp_path):
  write_mnist_folder(tmp_path, gz=False)
  write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(11), LABEL_MAGIC)
  _one_line_error(lambda: load_dataset("mnist", str(tmp_path)), "train-labels-idx1-ubyte",
                  "11 labels, expected 12")


def test_bad_gzip_stream(tmp_path):
  write_mnist_folder(tmp_path, gz=True)
  path = tmp_path / "train-images-idx3-ubyte.gz"
  path.write_bytes(b"\x1f\x8b" + b"not really gzip" * 10)
  _one_line_error(lambda: load_dataset("mnist", str(tmp_path)), str(path), "cannot read")


def test_missing_dataset_names_places_and_fix(tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path))
  monkeypatch.delenv("FEDJAX_DP_DATA", raising=False)
  ok, why = find_dataset("mnist", str(tmp_path))
  assert not ok and "data_dir" in why
  _one_line_error(lambda: load_dataset("mnist", str(tmp_path)), "dataset 'mnist' not found",
                  str(tmp_path))
  _one_line_error(lambda: load_dataset("imagenet"), "unknown dataset 'imagenet'")


def write_cifar(folder, n=4, seed=0):
  rng = np.random.default_rng(seed)
  os.makedirs(folder, exist_ok=True)
  batches = {}
  for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
    batch = {b"data": rng.integers(0, 256, (n, 3072)).astype(np.uint8),
             b"labels": list(rng.integers(0, 10, n))}
    with open(os.path.join(folder, name), "wb") as f:
      pickle.dump(batch, f)
    batches[name] = batch
  return batches


def test_cifar_round_trip_and_corruption(tmp_path):
  batches = write_cifar(tmp_path / "cifar-10-batches-py")
  ds = load_dataset("cifar10", str(tmp_path))
  assert ds.x_train.shape == (20, 32, 32, 3) and ds.x_test.shape == (4, 32, 32, 3)
  first = batches["data_batch_1"][b"data"][0]
  # channel-major storage: pixel (row 0, col 1) of channel 2 is at 2*1024 + 1
  assert ds.x_train[0, 0, 1, 2] * 255 == pytest.approx(first[2 * 1024 + 1])
  np.testing.assert_array_equal(ds.y_test, batches["test_batch"][b"labels"])
  (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"junk")
  _one_line_error(lambda: load_dataset("cifar10", str(tmp_path)), "data_batch_3",
                  "not a CIFAR-10 python batch")


def test_csv(tmp_path):
  path = tmp_path / "t.csv"
  path.write_text("a,b,label\n" + "".join(f"{i},{2 * i},{'yes' if i % 3 else 'no'}\n"
                                          for i in range(20)))
  ds = load_dataset("csv", path=str(path), seed=1)
  assert ds.x_train.shape == (16, 2) and ds.x_test.shape == (4, 2) and ds.num_classes == 2
  np.testing.assert_allclose(ds.x_train.mean(0), 0, atol=1e-6)
  np.testing.assert_allclose(ds.x_train.std(0), 1, atol=1e-5)
  both = np.concatenate([ds.y_train, ds.y_test])
  assert sorted(both.tolist()) == sorted([1 if i % 3 else 0 for i in range(20)])
  bad = tmp_path / "bad.csv"
  bad.write_text("a,label\n1,0\nx,1\n")
  _one_line_error(lambda: load_dataset("csv", path=str(bad)), str(bad), "line 3", "'a'",
                  "is not a number")
  _one_line_error(lambda: load_dataset("csv", path=str(path), label_column="y"), "no column 'y'")
  _one_line_error(lambda: load_dataset("csv", path=str(tmp_path / "none.csv")), "no such CSV")
  _one_line_error(lambda: load_dataset("fmnist", data_dir=str(tmp_path / "nowhere")),
                  "data_dir", "is not a folder")
  for value in ("nan", "inf", "-Infinity"):
    bad.write_text(f"a,label\n1,0\n{value},1\n")
    _one_line_error(lambda: load_dataset("csv", path=str(bad)), "line 3", "is not a finite number")
  bad.write_bytes(b"a,label\n\xff\xfe,0\n")
  _one_line_error(lambda: load_dataset("csv", path=str(bad)), "not UTF-8 text")


def test_digits_and_synthetic_are_deterministic():
  a, b = load_dataset("digits", seed=0), load_dataset("digits", seed=0)
  assert a.x_train.shape == (1438, 8, 8, 1) and len(a.y_test) == 359
  np.testing.assert_array_equal(a.y_train, b.y_train)
  assert 0.0 <= a.x_train.min() and a.x_train.max() <= 1.0
  s = load_dataset("synthetic", seed=3, num_examples=500, num_features=7, num_classes=4)
  assert s.x_train.shape == (500, 7) and s.x_test.shape == (100, 7) and s.num_classes == 4
  np.testing.assert_array_equal(s.x_train, load_dataset("synthetic", seed=3, num_examples=500,
                                                        num_features=7, num_classes=4).x_train)


def test_synthetic_is_learnable_but_not_trivial():
  from sklearn.linear_model import LogisticRegression
  s = load_dataset("synthetic", seed=0, num_examples=3000)
  acc = LogisticRegression(max_iter=500).fit(s.x_train, s.y_train).score(s.x_test, s.y_test)
  assert 0.5 < acc < 0.99


@pytest.mark.skipif(not os.path.exists(os.path.join(DEBIAN_FMNIST, "train-images-idx3-ubyte.gz")),
                    reason="Fashion-MNIST not installed: apt-get install dataset-fashion-mnist")
def test_real_fashion_mnist_files():
  ds = load_dataset("fmnist")
  assert ds.x_train.shape == (60000, 28, 28, 1) and ds.x_test.shape == (10000, 28, 28, 1)
  np.testing.assert_array_equal(np.bincount(ds.y_train), [6000] * 10)
  np.testing.assert_array_equal(np.bincount(ds.y_test), [1000] * 10)


def test_loader_gaps_found_by_an_audit(tmp_path):
  """Each of these trained on something else or died with a traceback before."""
  # a data_dir holding three of the four IDX files: an error, not the system's copy
  write_mnist_folder(tmp_path / "partial", gz=False)
  os.remove(tmp_path / "partial" / "t10k-labels-idx1-ubyte")
  _one_line_error(lambda: load_dataset("fmnist", data_dir=str(tmp_path / "partial")),
                  "but not t10k-labels-idx1-ubyte", "needs all four IDX files")
  # training and test images of different sizes
  write_mnist_folder(tmp_path / "shape", gz=False)
  write_idx(tmp_path / "shape" / "t10k-images-idx3-ubyte", np.zeros((5, 32, 32)), IMAGE_MAGIC)
  _one_line_error(lambda: load_dataset("mnist", data_dir=str(tmp_path / "shape")),
                  "(28, 28) and test images (32, 32)")
  # CIFAR batches with string labels
  batches = write_cifar(tmp_path / "cifar-10-batches-py")
  b = dict(batches["test_batch"])
  b[b"labels"] = [str(v) for v in b[b"labels"]]
  with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as f:
    pickle.dump(b, f)
  _one_line_error(lambda: load_dataset("cifar10", str(tmp_path)), "integer labels")
  csv_path = tmp_path / "c.csv"
  rows = "".join(f"{i},{i % 3}\n" for i in range(12))
  # a byte-order mark (spreadsheet exports): the header still reads 'label'
  csv_path.write_bytes(b"\xef\xbb\xbfa,label\n" + rows.encode())
  assert load_dataset("csv", path=str(csv_path)).num_classes == 3
  # "1" and "1.0" are one class; 1.7, an empty label and a single class are errors
  csv_path.write_text("a,label\n" + "".join(f"{i},{['1', '1.0', '2'][i % 3]}\n" for i in range(12)))
  assert load_dataset("csv", path=str(csv_path)).num_classes == 2
  for labels, message in ((["1", "1.7"], "label '1.7'"), (["1", ""], "empty 'label'"),
                          (["3", "3"], "holds one class ('3')")):
    csv_path.write_text("a,label\n" + "".join(f"{i},{labels[i % 2]}\n" for i in range(12)))
    _one_line_error(lambda: load_dataset("csv", path=str(csv_path)), message)
  csv_path.write_text("a,label\n" + "9" * 200_000 + ",1\n1,2\n")
  _one_line_error(lambda: load_dataset("csv", path=str(csv_path)), "field larger than field limit")
  # a tier map that is not UTF-8
  from fedjax_dp.data.tabular import TierMapError, read_tier_map
  (tmp_path / "tiers.csv").write_bytes(b"feature,tier\n\xff,high\n")
  with pytest.raises(TierMapError, match="not UTF-8 text"):
    read_tier_map(str(tmp_path / "tiers.csv"), ["a"])
  (tmp_path / "tiers.csv").write_text("feature,tier\na,high\nb,low\na,public\n")
  with pytest.raises(TierMapError, match="feature 'a' is mapped twice \\(row 3\\)"):
    read_tier_map(str(tmp_path / "tiers.csv"), ["a", "b"])


def test_classes_per_client_only_binds_shards():
  from fedjax_dp.data.partition import partition
  labels = np.arange(100) % 10
  parts = partition(labels, 60, "iid", classes_per_client=2)   # 60 * 2 > 100 is shards' limit
  assert sorted(np.concatenate(parts).tolist()) == list(range(100))
  _one_line_error(lambda: partition(labels, 60, "shards", classes_per_client=2),
                  "classes_per_client = 2: shards needs")
