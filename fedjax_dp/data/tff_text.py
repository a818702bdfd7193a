"""TensorFlow Federated's text datasets, read with h5py and tokenised as FedJAX does:
Shakespeare (next character, every position) and Stack Overflow (next word).

The files (TFF's HDF5ClientData layout, tff_h5.py: examples/<client id>/<feature>):

  shakespeare_{train,test}.h5   snippets: variable-length byte strings [n], a
      speaking role's lines; 715 roles, the test file holding the same roles'
      held-out snippets (shakespeare.tar.bz2).
  stackoverflow_{train,test}.h5 (and _held_out.h5, not read)  tokens: byte strings
      [n] of space-separated words, one post each, besides title, tags, type, score
      and creation_date; 342,477 training users, the test file holding the same
      users' posts after 2018-01-01 (stackoverflow.tar.bz2).
  stackoverflow.word_count      `word count` lines, most frequent first
      (stackoverflow.word_count.tar.bz2): the vocabulary is its first 10,000 words.

Tokens (ids as FedJAX numbers them; inputs come back as float32 [N, T], exact
below 2^24, targets as int32 [N, T]):

  Shakespeare  PAD 0, BOS 1, EOS 2, the 86 characters of TFF's text-generation
      tutorial 3..88, any other byte OOV 89 (vocabulary 90). A role's snippets are
      joined, each as BOS, its bytes, EOS, and cut into x = joined[:-1],
      y = joined[1:] in rows of 80, the last padded with PAD.
  Stack Overflow  PAD 0, BOS 1, EOS 2, the vocabulary's words 3..10,002, one
      out-of-vocabulary bucket 10,003 (vocabulary 10,004). Each post is BOS, its
      words (split at each single space, as TF's split with sep=' ': an empty
      piece is an out-of-vocabulary word), EOS; x = that without its last id, y
      without its first, padded with PAD or truncated to 20.

The task (losses.next_token) scores every non-PAD target; its accuracy leaves out
EOS targets and never predicts PAD, BOS, EOS or OOV (an OOV target is a miss), as
FedJAX's accuracy_in_vocab does. Stack Overflow's 135 million posts do not fit in
memory: with partition natural_id only the clients a run takes are read.
"""

from __future__ import annotations

import os

import numpy as np

from fedjax_dp import losses
from fedjax_dp.data.dataset import Dataset
from fedjax_dp.data.natural import choose_clients, from_client_arrays, take_clients
from fedjax_dp.data.tff_h5 import find_h5_folder, how_to_get, read_clients, read_client_ids
from fedjax_dp.errors import DataError

PAD, BOS, EOS = 0, 1, 2
SHAKESPEARE_CHARS = (b"dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#'/37;?bfjnrvzBFJNRVZ\"&*.26:\n"
                     b"aeimquyAEIMQUY]!%)-159\r")
SHAKESPEARE_OOV = 3 + len(SHAKESPEARE_CHARS)            # 89
SHAKESPEARE_VOCAB = SHAKESPEARE_OOV + 1                  # 90
SHAKESPEARE_LENGTH = 80
SO_WORDS, SO_LENGTH = 10_000, 20
SO_OOV = 3 + SO_WORDS                                    # 10,003
SO_VOCAB = SO_OOV + 1                                    # 10,004
WORD_COUNTS = "stackoverflow.word_count"
_WORD_COUNTS_URL = ("https://storage.googleapis.com/tff-datasets-public/"
                    "stackoverflow.word_count.tar.bz2")

_TABLE = np.full(256, SHAKESPEARE_OOV, np.int32)
_TABLE[np.frombuffer(SHAKESPEARE_CHARS, np.uint8)] = np.arange(3, SHAKESPEARE_OOV)


def task(name: str) -> losses.Task:
  """The next_token task of `name` (shakespeare_tff or stackoverflow)."""
  oov = SHAKESPEARE_OOV if name == "shakespeare_tff" else SO_OOV
  return losses.next_token(pad=PAD, not_scored=(EOS,), never_predicted=(PAD, BOS, EOS, oov))


def _text(value) -> bytes:
  return value if isinstance(value, bytes) else str(value).encode()


def shakespeare_sequences(snippets, length: int = SHAKESPEARE_LENGTH
                          ) -> tuple[np.ndarray, np.ndarray]:
  """One role's snippets [n] -> (x, y) int32 [m, length]: joined with BOS / EOS
  around each, shifted by one, cut into rows, the last padded with PAD."""
  pieces = []
  for s in snippets:
    b = np.frombuffer(_text(s), np.uint8)
    pieces.append(np.concatenate([[BOS], _TABLE[b], [EOS]]).astype(np.int32))
  joined = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
  n = max(len(joined) - 1, 0)
  rows = -(-n // length)
  x, y = (np.full(rows * length, PAD, np.int32) for _ in range(2))
  x[:n], y[:n] = joined[:-1], joined[1:]
  return x.reshape(rows, length), y.reshape(rows, length)


def stackoverflow_sequences(posts, vocab: dict[bytes, int], length: int = SO_LENGTH
                            ) -> tuple[np.ndarray, np.ndarray]:
  """One user's posts [n] (space-separated words) -> (x, y) int32 [n, length]."""
  x, y = (np.full((len(posts), length), PAD, np.int32) for _ in range(2))
  for i, post in enumerate(posts):
    # split at every single space, as tf.strings.split(sep=' ') does: an empty piece
    # (two spaces, an empty post) is a word too, out of the vocabulary
    ids = [BOS] + [vocab.get(w, SO_OOV) for w in _text(post).split(b" ")] + [EOS]
    seq = np.asarray(ids[:length + 1], np.int32)
    x[i, :len(seq) - 1], y[i, :len(seq) - 1] = seq[:-1], seq[1:]
  return x, y


def read_vocabulary(folder: str, words: int = SO_WORDS) -> dict[bytes, int]:
  """The first `words` words of stackoverflow.word_count -> ids 3.. (in file order)."""
  path = os.path.join(folder, WORD_COUNTS)
  if not os.path.isfile(path):
    raise DataError(f"dataset 'stackoverflow': {path} not found: download {_WORD_COUNTS_URL} "
                    "and unpack it (tar xjf) into the folder holding the HDF5 files")
  vocab: dict[bytes, int] = {}
  with open(path, "rb") as f:
    for number, line in enumerate(f, 1):
      if len(vocab) == words:
        break
      parts = line.split()
      if len(parts) != 2 or not parts[1].isdigit():
        raise DataError(f"{path}: line {number} is {line[:60]!r}, expected 'word count'")
      if parts[0] in vocab:   # TF's vocabulary table refuses a repeated key too
        raise DataError(f"{path}: line {number} repeats the word {parts[0]!r} (line "
                        f"{vocab[parts[0]] - 2}): each word once")
      vocab[parts[0]] = 3 + len(vocab)
  if len(vocab) < words:
    raise DataError(f"{path}: holds {len(vocab)} words; the benchmark's vocabulary is the "
                    f"first {words}")
  return vocab


def load_tff_text(name: str, data_dir: str | None, clients: tuple[int, int, int] | None = None
                  ) -> Dataset:
  """shakespeare_tff or stackoverflow as a Dataset of its clients. `clients`:
  (num_clients, test_clients, seed) of partition natural_id: only those clients
  are read (natural.choose_clients draws them from the file's ids), and the
  Dataset is what select_clients would make of the whole file."""
  folder, searched = find_h5_folder(name, data_dir)
  if folder is None:
    raise DataError(f"dataset {name!r} not found (searched {', '.join(searched)}): "
                    f"{how_to_get(name)}")
  stem = "shakespeare" if name == "shakespeare_tff" else "stackoverflow"
  paths = {s: os.path.join(folder, f"{stem}_{s}.h5") for s in ("train", "test")}
  if name == "shakespeare_tff":
    feature, vocab_size = "snippets", SHAKESPEARE_VOCAB
    tokenise = shakespeare_sequences
  else:
    feature, vocab_size = "tokens", SO_VOCAB
    vocab = read_vocabulary(folder)
    tokenise = lambda posts: stackoverflow_sequences(posts, vocab)
  wanted = None
  if clients is not None:
    ids = read_client_ids(paths["train"])
    held, kept = choose_clients(len(ids), *clients, name)
    chosen = np.sort(np.concatenate([held, kept]))   # indices into the file's sorted ids
    wanted = {ids[i] for i in chosen}
  splits = {}
  for split, path in paths.items():
    splits[split] = []
    for cid, arrays in read_clients(path, (feature,), only=wanted):
      x, y = tokenise(arrays[feature])
      splits[split].append((cid, x.astype(np.float32), y))
  ds = from_client_arrays(name, splits["train"], splits["test"], vocab_size, folder,
                          same_clients=True)
  if clients is None:
    return ds
  # the chosen clients' places among those read (they were read in file order)
  return take_clients(ds, np.searchsorted(chosen, held), np.searchsorted(chosen, kept))[0]
