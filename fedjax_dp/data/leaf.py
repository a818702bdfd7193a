"""LEAF's JSON files (Caldas et al. 2018, https://github.com/TalwalkarLab/leaf): FEMNIST
and Shakespeare.

LEAF's preprocessing writes each split as JSON files in `data/<name>/data/train/`
and `.../test/`, each file an object
  {"users": [id, ...], "num_samples": [n, ...],
   "user_data": {id: {"x": [example, ...], "y": [label, ...]}, ...}}
(and sometimes "hierarchies": [...], which we do not read). A user's examples are
in one file per split; its test examples are held out of the same user's data
(LEAF's --sf sample split), so the test split holds the trained clients' rows.

FEMNIST: x is 784 floats, a 28 x 28 image row by row, in [0, 1] with the paper
at 1.0 and the ink near 0; y is 0..61 (digits 0-9, upper case A-Z 10-35, lower
case a-z 36-61). We return ink as 1 on a background of 0, as MNIST's images
and FedJAX's EMNIST are: 1 - x, as float32 [N, 28, 28, 1].

Shakespeare: a user is a speaking role of a play; x is a string of 80 characters
and y the character that follows it (next-character prediction as LEAF's
baseline runs it). Characters are numbered by their place in LEAF's 80-symbol
alphabet (LETTERS, its models' ALL_LETTERS); any other character is one more
class, 80 (LEAF's own lookup would give -1). x comes back as float32 [N, 80]
holding those ids (exact below 2^24; a token model casts them to int), y as
int32 [N] in 0..80.
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np

from fedjax_dp.data.dataset import Dataset
from fedjax_dp.data.images import search_roots
from fedjax_dp.data.natural import from_client_arrays
from fedjax_dp.errors import DataError

HOW_TO_GET = {
    "femnist": ("clone https://github.com/TalwalkarLab/leaf, run `./preprocess.sh -s niid --sf "
                "1.0 -k 0 -t sample` in data/femnist, and set data_dir to data/femnist/data "
                "(the folder holding train/ and test/)"),
    "shakespeare": ("clone https://github.com/TalwalkarLab/leaf, run `./preprocess.sh -s niid "
                    "--sf 1.0 -k 0 -t sample -tf 0.8` in data/shakespeare, and set data_dir to "
                    "data/shakespeare/data (the folder holding train/ and test/)"),
}
# LEAF's Shakespeare alphabet (models/utils/language_utils.py ALL_LETTERS), in its order
LETTERS = ("\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}")
SEQUENCE = 80   # characters of context in each example
_INDEX = {c: i for i, c in enumerate(LETTERS)}
_SUBDIRS = ("", "data", "{name}/data", "leaf/data/{name}/data")


def find_leaf_folder(name: str, data_dir: str | None) -> tuple[str | None, list[str]]:
  """The first folder holding train/*.json and test/*.json, searched under data_dir
  and $FEDJAX_DP_DATA (and LEAF's own layout below them)."""
  searched = []
  for root in search_roots(data_dir):
    for sub in _SUBDIRS:
      folder = os.path.normpath(os.path.join(root, sub.format(name=name)))
      searched.append(folder)
      if all(glob.glob(os.path.join(folder, split, "*.json")) for split in ("train", "test")):
        return folder, searched
  return None, searched


def _read_json(path: str) -> dict:
  try:
    with open(path) as f:
      blob = json.load(f)
  except (OSError, ValueError) as e:
    raise DataError(f"{path}: cannot read as JSON ({e.__class__.__name__}: {e})") from None
  missing = [k for k in ("users", "num_samples", "user_data") if k not in blob]
  if not isinstance(blob, dict) or missing:
    raise DataError(f"{path}: not a LEAF data file (missing {', '.join(missing) or 'an object'}); "
                    "expected keys users, num_samples, user_data")
  if len(blob["users"]) != len(blob["num_samples"]):
    raise DataError(f"{path}: {len(blob['users'])} users but {len(blob['num_samples'])} "
                    "num_samples")
  return blob


def read_split(folder: str) -> list[tuple[str, list, list]]:
  """[(user id, x, y)] of every JSON file in `folder`, users in id order."""
  users: dict[str, tuple[list, list]] = {}
  for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
    blob = _read_json(path)
    for user, n in zip(blob["users"], blob["num_samples"]):
      data = blob["user_data"].get(user)
      if data is None or len(data.get("x", ())) != n or len(data.get("y", ())) != n:
        got = None if data is None else (len(data.get("x", ())), len(data.get("y", ())))
        raise DataError(f"{path}: user {user!r} has num_samples {n} but (x, y) lengths {got}")
      if user in users:
        raise DataError(f"{path}: user {user!r} is also in another file of {folder}")
      users[user] = (data["x"], data["y"])
  return [(u, *users[u]) for u in sorted(users)]


def _femnist_arrays(path: str, user: str, x: list, y: list):
  images = np.asarray(x, np.float32).reshape(-1, 784) if not x else np.asarray(x, np.float32)
  labels = np.asarray(y, np.int64) if not y else np.asarray(y)
  if labels.dtype.kind == "f" and np.array_equal(labels, np.round(labels)):
    labels = labels.astype(np.int64)   # 4.0 is class 4
  if images.ndim != 2 or images.shape[1] != 784:
    raise DataError(f"{path}: user {user!r} has x of shape {images.shape}, expected [n, 784] "
                    "(28 x 28 pixels per example)")
  if labels.dtype.kind not in "iu" or labels.min(initial=0) < 0 or labels.max(initial=0) > 61:
    raise DataError(f"{path}: user {user!r} has labels outside 0..61 (FEMNIST's 62 classes)")
  return user, (1.0 - images).reshape(-1, 28, 28, 1), labels.astype(np.int32)


def _load(name: str, data_dir: str | None, arrays, classes: int) -> Dataset:
  """LEAF dataset `name`'s users as clients, each split's (user, x, y) made arrays
  by `arrays(path, user, x, y)`."""
  folder, searched = find_leaf_folder(name, data_dir)
  if folder is None:
    raise DataError(f"dataset {name!r} not found (searched {', '.join(searched) or 'no data_dir'}"
                    f"): {HOW_TO_GET[name]}")
  splits = {s: [arrays(os.path.join(folder, s), *c) for c in read_split(os.path.join(folder, s))]
            for s in ("train", "test")}
  return from_client_arrays(name, splits["train"], splits["test"], classes, folder,
                            same_clients=True)


def load_femnist(data_dir: str | None) -> Dataset:
  """FEMNIST's writers as clients: 62 classes, float32 [N, 28, 28, 1] ink in [0, 1]."""
  return _load("femnist", data_dir, _femnist_arrays, 62)


def char_ids(text: str) -> list[int]:
  """Each character's place in LETTERS; any other character is len(LETTERS)."""
  return [_INDEX.get(c, len(LETTERS)) for c in text]


def _shakespeare_arrays(path: str, user: str, x: list, y: list):
  bad = next((s for s in x if not isinstance(s, str) or len(s) != SEQUENCE), None)
  if bad is not None:
    raise DataError(f"{path}: user {user!r} has an x of {len(bad) if isinstance(bad, str) else bad!r}"
                    f" characters, expected strings of {SEQUENCE}")
  if any(not isinstance(c, str) or len(c) != 1 for c in y):
    raise DataError(f"{path}: user {user!r} has a y that is not one character")
  ids = np.asarray([char_ids(s) for s in x], np.float32).reshape(-1, SEQUENCE)
  return user, ids, np.asarray(char_ids("".join(y)), np.int32)


def load_shakespeare(data_dir: str | None) -> Dataset:
  """LEAF's Shakespeare roles as clients: the next character of 80 (81 classes)."""
  return _load("shakespeare", data_dir, _shakespeare_arrays, len(LETTERS) + 1)
