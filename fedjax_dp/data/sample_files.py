"""Files in the real datasets' formats holding generated examples: to try a
format, to run the docs' commands and the benchmarks where the real files are
absent (`fedjax-dp datasets --write-sample NAME --out DIR`).

The layout, field names, dtypes and quirks are the real files' (leaf.py,
tff_h5.py): LEAF's JSON with users / num_samples / user_data (and the
`hierarchies` key LEAF writes), pixels with the paper at 1.0; TFF's HDF5 with
examples/<client id>/<feature>, EMNIST's float32 pixels and int32 labels,
CIFAR-100's uint8 images and int64 labels, its test clients other than its
training clients. The examples are learnable: each class an image template of
its own, each writer a shift and a stroke weight of its own, plus noise;
Shakespeare's text a Markov chain over 20 of LEAF's letters whose next
character has a known entropy (markov_chain: the floor a model's loss can reach).
Client sizes follow LEAF's FEMNIST (mean 226.83, standard deviation 88.94 a
writer: Caldas et al. 2018, table 1) scaled to `examples_per_client`, as a
gamma distribution with that mean and relative spread.
"""

from __future__ import annotations

import json
import os

import numpy as np

from fedjax_dp.errors import DataError

FEMNIST_MEAN, FEMNIST_STD = 226.83, 88.94   # examples a writer, LEAF's table 1
SAMPLES = ("femnist", "emnist", "emnist_digits", "cifar100", "shakespeare", "shakespeare_tff",
           "stackoverflow")
_TEST_SHARE = 0.1   # LEAF's --tf 0.9 and TFF's EMNIST hold out about a tenth


def client_sizes(num_clients: int, mean: float, rng: np.random.Generator) -> np.ndarray:
  """int64 [clients], each >= 2: gamma with FEMNIST's relative spread, scaled to `mean`."""
  shape = (FEMNIST_MEAN / FEMNIST_STD) ** 2
  return np.maximum(2, np.round(rng.gamma(shape, mean / shape, num_clients))).astype(np.int64)


def class_images(labels: np.ndarray, shape: tuple[int, ...], writer: int,
                 seed: int) -> np.ndarray:
  """float32 [n, *shape] in [0, 1]: class `label`'s template (seeded by the class),
  shifted and weighted by the writer, plus noise: ink near 1 on 0."""
  rng = np.random.default_rng([seed, writer])
  shift = rng.integers(-1, 2, 2)
  weight = rng.uniform(0.7, 1.0)
  out = np.empty((len(labels),) + shape, np.float32)
  for i, k in enumerate(labels):
    template = np.random.default_rng([seed, 10_000 + int(k)]).random(shape) > 0.7
    img = np.roll(template, tuple(shift), axis=(0, 1)) * weight
    out[i] = np.clip(img + rng.normal(0, 0.15, shape), 0, 1)
  return out


def _writer_ids(n: int) -> list[str]:
  """LEAF / NIST writer ids: f<4-digit writer>_<2-digit form>, in sorted order."""
  return sorted(f"f{i // 4:04d}_{10 + i % 4 * 20:02d}" for i in range(n))


def _client_split(size: int, num_classes: int, rng) -> tuple[np.ndarray, np.ndarray]:
  """(training labels, test labels) of one writer: a tenth held out, at least one."""
  labels = rng.integers(0, num_classes, size)
  n_test = max(1, int(round(size * _TEST_SHARE)))
  return labels[n_test:], labels[:n_test]


def write_leaf_femnist(folder: str, num_clients: int, examples_per_client: float,
                       seed: int) -> list[str]:
  """train/ and test/ JSON files of LEAF's FEMNIST layout; returns their paths."""
  rng = np.random.default_rng(seed)
  blobs = _leaf_blobs()
  for w, (user, size) in enumerate(zip(_writer_ids(num_clients),
                                       client_sizes(num_clients, examples_per_client, rng))):
    for split, labels in zip(("train", "test"), _client_split(size, 62, rng)):
      ink = class_images(labels, (28, 28), w, seed)
      paper = np.round(1.0 - ink.reshape(len(labels), 784), 6)   # LEAF: paper 1.0, ink near 0
      _add_user(blobs[split], user, paper.tolist(), [int(v) for v in labels])
  return _write_leaf(folder, blobs, "all_data_0_niid_0_keep_0_{split}_9.json")


def _leaf_blobs() -> dict[str, dict]:
  return {s: {"users": [], "num_samples": [], "user_data": {}, "hierarchies": []}
          for s in ("train", "test")}


def _add_user(blob: dict, user: str, x: list, y: list) -> None:
  blob["users"].append(user)
  blob["num_samples"].append(len(y))
  blob["user_data"][user] = {"x": x, "y": y}


def _write_leaf(folder: str, blobs: dict[str, dict], name: str) -> list[str]:
  """Each split's blob as <folder>/<split>/<name>; returns the paths."""
  paths = []
  for split, blob in blobs.items():
    os.makedirs(os.path.join(folder, split), exist_ok=True)
    paths.append(os.path.join(folder, split, name.format(split=split)))
    with open(paths[-1], "w") as f:
      json.dump(blob, f)
  return paths


def _write_h5(path: str, clients: dict[str, dict[str, np.ndarray]]) -> str:
  import h5py
  with h5py.File(path, "w") as f:
    group = f.create_group("examples")
    for cid, features in clients.items():
      g = group.create_group(cid)
      for key, value in features.items():
        if isinstance(value, list):   # text: variable-length byte strings, as TFF's files
          g.create_dataset(key, data=value, dtype=h5py.string_dtype("ascii"))
        else:
          g.create_dataset(key, data=value)
  return path


def write_tff_emnist(folder: str, num_clients: int, examples_per_client: float, seed: int,
                     digits_only: bool = False) -> list[str]:
  """fed_emnist[_digitsonly]_{train,test}.h5: the same writers in both files."""
  rng = np.random.default_rng(seed)
  classes, stem = (10, "fed_emnist_digitsonly") if digits_only else (62, "fed_emnist")
  splits = {"train": {}, "test": {}}
  for w, (cid, size) in enumerate(zip(_writer_ids(num_clients),
                                      client_sizes(num_clients, examples_per_client, rng))):
    for split, labels in zip(("train", "test"), _client_split(size, classes, rng)):
      pixels = 1.0 - class_images(labels, (28, 28), w, seed)   # TFF: paper 1.0
      splits[split][cid] = {"label": labels.astype(np.int32), "pixels": pixels}
  os.makedirs(folder, exist_ok=True)
  return [_write_h5(os.path.join(folder, f"{stem}_{s}.h5"), c) for s, c in splits.items()]


def write_tff_cifar100(folder: str, num_clients: int, examples_per_client: float,
                       seed: int) -> list[str]:
  """fed_cifar100_{train,test}.h5: test clients other than the training clients
  (TFF: 500 and 100), each example's fine label in its coarse class (fine // 5)."""
  rng = np.random.default_rng(seed)
  counts = {"train": num_clients, "test": max(1, num_clients // 5)}
  paths = []
  os.makedirs(folder, exist_ok=True)
  for split, n in counts.items():
    clients = {}
    for c in range(n):
      fine = rng.integers(0, 100, max(2, int(round(examples_per_client))))
      ink = class_images(fine, (32, 32, 3), c + (0 if split == "train" else 100_000), seed)
      clients[str(c)] = {"coarse_label": (fine // 5).astype(np.int64),
                         "image": np.round(ink * 255).astype(np.uint8),
                         "label": fine.astype(np.int64)}
    paths.append(_write_h5(os.path.join(folder, f"fed_cifar100_{split}.h5"), clients))
  return paths


def markov_chain(seed: int, letters: int = 20, successors: int = 3
                 ) -> tuple[np.ndarray, np.ndarray, float]:
  """(the alphabet's letters used [letters], transitions [letters, letters], the
  chain's entropy rate in nats): each letter followed by one of `successors`
  others, with probabilities drawn once; the rate is sum_i pi_i H(row_i) over its
  stationary distribution pi."""
  rng = np.random.default_rng([seed, 7])
  used = rng.choice(np.arange(1, 80), letters, replace=False)   # LEAF's letters, not '\n'
  p = np.zeros((letters, letters))
  for i in range(letters):
    p[i, rng.choice(letters, successors, replace=False)] = rng.dirichlet(np.ones(successors) * 2)
  w, v = np.linalg.eig(p.T)
  pi = np.real(v[:, np.argmin(np.abs(w - 1))])
  pi = pi / pi.sum()
  rows = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0), axis=1)
  return used, p, float(pi @ rows)


def write_leaf_shakespeare(folder: str, num_clients: int, examples_per_client: float,
                           seed: int) -> list[str]:
  """train/ and test/ JSON files of LEAF's Shakespeare layout: each role's text a
  walk of markov_chain, its examples 80 characters and the next one; a fifth of
  each role's examples held out (LEAF's -tf 0.8)."""
  from fedjax_dp.data.leaf import LETTERS, SEQUENCE
  rng = np.random.default_rng(seed)
  used, p, _ = markov_chain(seed)
  blobs = _leaf_blobs()
  for r, size in enumerate(client_sizes(num_clients, examples_per_client, rng)):
    state, walk = int(rng.integers(len(used))), []
    for _ in range(size + SEQUENCE):
      walk.append(LETTERS[used[state]])
      state = int(rng.choice(len(used), p=p[state]))
    text = "".join(walk)
    x = [text[i:i + SEQUENCE] for i in range(size)]
    y = [text[i + SEQUENCE] for i in range(size)]
    cut = max(1, int(round(size * 0.8)))
    user = f"THE_SAMPLE_PLAY_ROLE_{r:04d}"
    for split, sl in (("train", slice(0, cut)), ("test", slice(cut, size))):
      _add_user(blobs[split], user, x[sl], y[sl])
  return _write_leaf(folder, blobs, "all_data_niid_0_keep_0_{split}_8.json")


def _walk(rng, p: np.ndarray, steps: int) -> list[int]:
  """`steps` states of the chain with transitions p, from a uniform start."""
  state, out = int(rng.integers(len(p))), []
  for _ in range(steps):
    out.append(state)
    state = int(rng.choice(len(p), p=p[state]))
  return out


def write_tff_shakespeare(folder: str, num_clients: int, examples_per_client: float,
                          seed: int) -> list[str]:
  """shakespeare_{train,test}.h5: each role's snippets (byte strings of 20-120
  characters) walks of markov_chain over LEAF's letters; a fifth of each role's
  snippets in the test file (the same roles, as TFF's)."""
  from fedjax_dp.data.leaf import LETTERS
  rng = np.random.default_rng(seed)
  used, p, _ = markov_chain(seed)
  splits = {"train": {}, "test": {}}
  for r, size in enumerate(client_sizes(num_clients, examples_per_client, rng)):
    snippets = ["".join(LETTERS[used[i]] for i in _walk(rng, p, int(rng.integers(20, 121))))
                .encode() for _ in range(size)]
    cut = max(1, int(round(size * 0.8)))
    cid = f"THE_SAMPLE_PLAY_ROLE_{r:04d}"
    splits["train"][cid], splits["test"][cid] = {"snippets": snippets[:cut]}, \
        {"snippets": snippets[cut:]}
  os.makedirs(folder, exist_ok=True)
  return [_write_h5(os.path.join(folder, f"shakespeare_{s}.h5"), c) for s, c in splits.items()]


def write_tff_stackoverflow(folder: str, num_clients: int, examples_per_client: float,
                            seed: int) -> list[str]:
  """stackoverflow_{train,test}.h5 and stackoverflow.word_count: 10,050 words
  (w00000, w00001, ... by decreasing count, so the last 50 are out of the
  vocabulary); each user's posts (5-30 words) walks of a word chain over the 40
  most frequent words, one word in 20 replaced by a rare one (some beyond the
  vocabulary); the other features TFF's files hold, with their dtypes."""
  from fedjax_dp.data.tff_text import SO_WORDS, WORD_COUNTS
  rng = np.random.default_rng(seed)
  words = [f"w{i:05d}" for i in range(SO_WORDS + 50)]
  _, p, _ = markov_chain(seed, letters=40)
  splits = {"train": {}, "test": {}}
  for u, size in enumerate(client_sizes(num_clients, examples_per_client, rng)):
    posts = []
    for _ in range(size):
      ids = [i if rng.random() > 0.05 else int(rng.integers(40, len(words)))
             for i in _walk(rng, p, int(rng.integers(5, 31)))]
      posts.append(" ".join(words[i] for i in ids).encode())
    cut = max(1, int(round(size * 0.8)))
    for split, rows in (("train", posts[:cut]), ("test", posts[cut:])):
      n = len(rows)
      splits[split][f"{u:08d}"] = {
          "creation_date": [b"2017-06-01 12:00:00.00 UTC"] * n, "score": np.zeros(n, np.int64),
          "tags": [b"python|numpy"] * n, "title": [b"a sample title"] * n, "tokens": rows,
          "type": [b"question" if i % 2 == 0 else b"answer" for i in range(n)]}
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, WORD_COUNTS), "w") as f:
    f.writelines(f"{w} {100_000 - i}\n" for i, w in enumerate(words))
  return [_write_h5(os.path.join(folder, f"stackoverflow_{s}.h5"), c)
          for s, c in splits.items()] + [os.path.join(folder, WORD_COUNTS)]


def write_sample(name: str, folder: str, num_clients: int = 20,
                 examples_per_client: float = 40.0, seed: int = 0) -> list[str]:
  """Writes dataset `name`'s files (SAMPLES) with generated examples into `folder`
  (which must not hold them already: nothing is overwritten); returns their paths."""
  if name not in SAMPLES:
    raise DataError(f"no sample files for dataset {name!r} (allowed: {', '.join(SAMPLES)})")
  if num_clients < 2 or examples_per_client < 2:
    raise DataError(f"write_sample: num_clients {num_clients} and examples_per_client "
                    f"{examples_per_client}: both must be >= 2")
  if os.path.exists(folder) and os.listdir(folder):
    raise DataError(f"{folder}: exists and is not empty; sample files go to a new folder")
  if name == "femnist":
    return write_leaf_femnist(folder, num_clients, examples_per_client, seed)
  if name == "shakespeare":
    return write_leaf_shakespeare(folder, num_clients, examples_per_client, seed)
  if name == "cifar100":
    return write_tff_cifar100(folder, num_clients, examples_per_client, seed)
  if name == "shakespeare_tff":
    return write_tff_shakespeare(folder, num_clients, examples_per_client, seed)
  if name == "stackoverflow":
    return write_tff_stackoverflow(folder, num_clients, examples_per_client, seed)
  return write_tff_emnist(folder, num_clients, examples_per_client, seed,
                          digits_only=name == "emnist_digits")
