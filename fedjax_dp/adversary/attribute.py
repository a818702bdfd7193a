"""Attribute inference on a trained global model (tabular data).

The attacker knows an example's label and every feature but one sensitive
column j, and the column's values in the population (the training marginal).
For each candidate value v it puts v in column j and reads the model's loss on
the true label; it guesses the v with the smallest loss less log p(v) (Yeom et
al. 2018's attack with the prior, Fredrikson et al. 2014's idea). A column with
more than `max_values` distinct values is cut into `bins` quantile bins, each
tried at its median, and a guess is right when it names the true value's bin.

Reported for members (training examples) and non-members (test examples)
apart: the share guessed right, and the baseline of always guessing the most
common value. A model that leaks the attribute beats the baseline, and beats it
by more on its members.
"""

from __future__ import annotations

import numpy as np

from fedjax_dp.adversary.membership import balanced_sets, example_losses


def candidates(column: np.ndarray, max_values: int = 10, bins: int = 4):
  """(candidate values [K], the bin of each value of `column` [n] in 0..K-1, prior
  [K]): the distinct values when at most max_values, else quantile bins at their
  medians."""
  values = np.unique(column)
  if len(values) <= max_values:
    which = np.searchsorted(values, column)
    return values, which, np.bincount(which, minlength=len(values)) / len(column)
  edges = np.quantile(column, np.linspace(0, 1, bins + 1)[1:-1])
  which = np.searchsorted(edges, column, side="right")
  reps = np.array([np.median(column[which == b]) for b in range(bins)], column.dtype)
  return reps, which, np.bincount(which, minlength=bins) / len(column)


def infer(apply_fn, params, x: np.ndarray, y: np.ndarray, j: int, values: np.ndarray,
          prior: np.ndarray) -> np.ndarray:
  """[n] the index of the value guessed for column j of each row of x [n, F]."""
  n, k = len(x), len(values)
  tried = np.repeat(x, k, axis=0)
  tried[:, j] = np.tile(values, n)
  losses = example_losses(apply_fn, params, tried, np.repeat(y, k)).reshape(n, k)
  return np.argmin(losses - np.log(np.maximum(prior, 1e-300))[None, :], axis=1)


def attribute_attack(apply_fn, params, x_train, y_train, x_test, y_test, j: int, *,
                     examples: int | None = None, seed: int = 0, max_values: int = 10,
                     bins: int = 4) -> dict:
  """The attack's success on members and non-members, and the baseline's."""
  if x_train.ndim != 2:
    raise ValueError(f"attribute inference reads a column of tabular rows; the inputs have "
                     f"shape {x_train.shape[1:]}")
  values, _, prior = candidates(x_train[:, j], max_values, bins)
  binned = len(values) != len(np.unique(x_train[:, j]))
  mem, non = balanced_sets(len(x_train), len(x_test), examples, seed)
  out = {}
  for name, x, y in (("members", x_train[mem], y_train[mem]),
                     ("nonmembers", x_test[non], y_test[non])):
    truth = _bin_of(x[:, j], x_train[:, j], values, binned, bins)
    guess = infer(apply_fn, params, x, y, j, values, prior)
    out[f"{name}_success"] = float(np.mean(guess == truth))
  return {"attack": "attribute_inference", "candidates": [float(v) for v in values],
          "binned": binned, "members": int(len(mem)), "nonmembers": int(len(non)), **out,
          "baseline_success": float(np.max(prior))}


def _bin_of(col, train_col, values, binned: bool, bins: int) -> np.ndarray:
  """Each value's candidate index, by the training column's bins or values."""
  if not binned:   # a value the training column never held is never guessed right
    idx = np.minimum(np.searchsorted(values, col), len(values) - 1)
    return np.where(values[idx] == col, idx, -1)
  edges = np.quantile(train_col, np.linspace(0, 1, bins + 1)[1:-1])
  return np.searchsorted(edges, col, side="right")
