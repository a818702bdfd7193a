"""Data poisoning by the Byzantine clients: they follow the protocol, on poisoned data.

The malicious clients are `attacks.malicious_clients` (drawn once from the data
seed). Before the first round their training examples are rewritten, so the
poison is inside the compiled round at no cost per step. Under byzantine_draw
'round' every client's examples are rewritten into a copy that the store keeps
after the clean ones, read by the clients each round draws
(attacks.make_data_redraw):

  label_flip   every label y -> C - 1 - y (C classes)
  targeted     every example of class `attack_source_class` relabelled
               `attack_target_class` (targeted poisoning of one class to another)
  backdoor     a `backdoor_fraction` of each malicious client's examples (seeded)
               carries the trigger and is relabelled `attack_target_class`
               (Bagdasaryan et al. 2020); with byzantine_scale s != 1 the upload is
               also boosted to s u (model replacement)

The trigger: on images [H, W, C] a 3 x 3 patch in the bottom-right corner set to
the largest value (a white square, as in BadNets); on tabular rows [F] the last 3
features set to their maximum plus their range (a value an honest row rarely
holds). Both are read from the test set, which is public: from the training data
they would let every client's data move every malicious client's rows, outside
the clip that bounds one client's influence under central DP. `triggered`
applies it. Which of a malicious client's examples carry it is drawn from the
data seed and that client's id alone (not another client's size).

What the attack achieves is measured on the test set: `attack_success_rate`, the
share of test examples of other classes that the model puts in the target class
once triggered; `target_misclassification`, the share of the source class's test
examples put in the target class.
"""

from __future__ import annotations

import numpy as np

DATA_ATTACKS = ("label_flip", "targeted", "backdoor")
TRIGGER = 3                  # the patch's side (images), the features set (tabular)
BACKDOOR_DRAW = 2**20 + 2    # folded into the data seed: which examples carry the trigger


def trigger_values(x_public: np.ndarray) -> np.ndarray | float:
  """What the trigger writes, from public data (the test set): its maximum (images),
  or per trigger feature its maximum plus its range (tabular)."""
  if x_public.ndim == 2:
    cols = x_public[:, -TRIGGER:]
    return (cols.max(0) + (cols.max(0) - cols.min(0))).astype(x_public.dtype)
  return np.asarray(x_public.max(), x_public.dtype)


def triggered(x: np.ndarray, value) -> np.ndarray:
  """A copy of x [n, ...] with the trigger in every row."""
  x = np.array(x, copy=True)
  if x.ndim == 2:
    x[:, -TRIGGER:] = value
  elif x.ndim >= 3:
    x[:, -TRIGGER:, -TRIGGER:, ...] = value
  else:
    raise ValueError(f"a trigger needs rows of features or images; got x of shape {x.shape}")
  return x


def poison(x: np.ndarray, y: np.ndarray, parts: list[np.ndarray], malicious: np.ndarray,
           kind: str, num_classes: int, source: int, target: int, fraction: float,
           seed: int, trigger=None) -> tuple[np.ndarray, np.ndarray, int]:
  """(x, y, examples poisoned): copies of the training data with the malicious
  clients' examples (parts[i] for malicious[i]) poisoned as `kind` says; `trigger`:
  the backdoor's value (trigger_values of the public test set)."""
  if kind not in DATA_ATTACKS:
    raise ValueError(f"data attack {kind!r}: allowed are {', '.join(DATA_ATTACKS)}")
  rows = (np.concatenate([parts[i] for i in np.flatnonzero(malicious)])
          if malicious.any() else np.zeros(0, np.int64))
  y = np.array(y, copy=True)
  if kind == "label_flip":
    y[rows] = num_classes - 1 - y[rows]
    return x, y, len(rows)
  if kind == "targeted":
    hit = rows[y[rows] == source]
    y[hit] = target
    return x, y, len(hit)
  if trigger is None:
    raise ValueError("a backdoor needs its trigger value (trigger_values of the test set)")
  # each client's own stream: another client's size does not move which rows it poisons
  hit = np.concatenate([np.asarray(parts[i])[np.random.default_rng(
      [seed, BACKDOOR_DRAW, int(i)]).random(len(parts[i])) < fraction]
                        for i in np.flatnonzero(malicious)] or [np.zeros(0, np.int64)])
  x = np.array(x, copy=True)
  x[hit] = triggered(x[hit], trigger)
  y[hit] = target
  return x, y, len(hit)


def attack_test_set(kind: str, x_test: np.ndarray, y_test: np.ndarray, source: int,
                    target: int):
  """(metric name, x, y) whose accuracy is the attack's success: backdoor, the test
  examples not of the target class, triggered, labelled target; targeted, the
  source class's test examples labelled target; label_flip: None."""
  if kind == "backdoor":
    keep = y_test != target
    return ("attack_success_rate", triggered(x_test[keep], trigger_values(x_test)),
            np.full(int(keep.sum()), target, y_test.dtype))
  if kind == "targeted":
    keep = y_test == source
    return ("target_misclassification", x_test[keep],
            np.full(int(keep.sum()), target, y_test.dtype))
  return None
