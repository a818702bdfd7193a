"""Plain numpy references of the kernels, in float64: the yardstick of their tests
and of `benchmarks/kernels.py`. Each takes the participants' rows only (u[mask])
and follows the formula in its kernel's docstring, with no JAX in it.
"""

from __future__ import annotations

import numpy as np


def l2_clip(leaves: list, clip_norm: float) -> list:
  """Flat L2 clipping of a list of arrays to `clip_norm` over all of them."""
  norm = np.sqrt(sum(np.sum(np.square(x, dtype=np.float64)) for x in leaves))
  scale = min(1.0, clip_norm / max(norm, 1e-30))
  return [x * scale for x in leaves]


def per_part_clip(leaves: list, part_of_leaf: tuple, bounds) -> list:
  """Each part (whole leaves, or a leaf's rows) clipped to its bound."""
  sq = np.zeros(len(bounds))
  for x, p in zip(leaves, part_of_leaf):
    rows = np.sum(np.square(x, dtype=np.float64).reshape(x.shape[0], -1), axis=1)
    if isinstance(p, tuple):
      np.add.at(sq, np.asarray(p), rows)
    else:
      sq[p] += rows.sum()
  scale = np.minimum(1.0, np.asarray(bounds) / np.maximum(np.sqrt(sq), 1e-30))
  out = []
  for x, p in zip(leaves, part_of_leaf):
    s = scale[np.asarray(p)].reshape((x.shape[0],) + (1,) * (x.ndim - 1)) if isinstance(
        p, tuple) else scale[p]
    out.append(x * s)
  return out


def topk_mask(x, k: int):
  """The k largest magnitudes of x as a boolean mask (ties broken by argpartition)."""
  mask = np.zeros(x.shape, bool)
  mask[np.argpartition(-np.abs(np.asarray(x)), k - 1)[:k]] = True
  return mask


def weighted_sum(w, a):
  """sum_i w_i a_i over the first axis."""
  return np.tensordot(np.asarray(w, np.float64), np.asarray(a, np.float64), axes=1)


def coordinate_median(p):
  return np.median(np.asarray(p, np.float64), axis=0)


def trimmed_mean(p, beta: float):
  t = int(np.floor(beta * len(p)))
  return np.sort(np.asarray(p, np.float64), axis=0)[t:len(p) - t].mean(0)


def krum_scores(p, f: int):
  """Sum of squared distances to the n - f - 2 (at least 1) nearest others."""
  p = np.asarray(p, np.float64)
  n = len(p)
  p = p - p.mean(0)   # distances do not move; float64's Gram form then loses nothing
  sq = np.sum(p * p, axis=1)
  d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (p @ p.T), 0.0)
  d2[np.arange(n), np.arange(n)] = np.inf
  return np.sort(d2, axis=1)[:, :max(n - f - 2, 1)].sum(1)


def krum(p, f: int, m_keep: int = 1):
  best = np.argsort(krum_scores(p, f), kind="stable")[:m_keep]
  return np.asarray(p, np.float64)[best].mean(0)


def outlier_flags(p, z: float):
  """Distance to the coordinate-wise median with a robust z-score above z."""
  p = np.asarray(p, np.float64)
  dist = np.linalg.norm(p - np.median(p, axis=0), axis=1)
  mad = np.median(np.abs(dist - np.median(dist)))
  return (dist - np.median(dist)) / max(1.4826 * mad, 1e-30) > z


def median_if_outliers(p, w, z: float):
  """The coordinate-wise median if any participant is an outlier, else the weighted mean."""
  if outlier_flags(p, z).any():
    return coordinate_median(p)
  w = np.asarray(w, np.float64)
  return weighted_sum(w, p) / w.sum()


def filtered_mean(p, w, cos_min: float, z: float):
  """Gradient filtering: drop a row whose cosine with the coordinate-wise median is
  below cos_min or whose norm's robust z-score is above z; the weighted mean of
  the rest (the median if none is left). Returns (aggregate, number dropped)."""
  p, w = np.asarray(p, np.float64), np.asarray(w, np.float64)
  med = coordinate_median(p)
  norm = np.linalg.norm(p, axis=1)
  cos = p @ med / np.maximum(norm * np.linalg.norm(med), 1e-30)
  mad = np.median(np.abs(norm - np.median(norm)))
  drop = (cos < cos_min) | ((norm - np.median(norm)) / max(1.4826 * mad, 1e-30) > z)
  if drop.all():
    return med, int(drop.sum())
  return weighted_sum(w[~drop], p[~drop]) / w[~drop].sum(), int(drop.sum())


def components(p, threshold: float):
  """Labels of the connected components of 'cosine similarity > threshold' (a label:
  the smallest index in its component)."""
  p = np.asarray(p, np.float64)
  un = p / np.linalg.norm(p, axis=1, keepdims=True)
  adj = un @ un.T > threshold
  labels = np.full(len(p), -1)
  for start in range(len(p)):
    if labels[start] >= 0:
      continue
    labels[start], todo = start, [start]
    while todo:
      i = todo.pop()
      for j in np.flatnonzero(adj[i] & (labels < 0)):
        labels[j] = start
        todo.append(j)
  return labels


def clustered_mean(p, w, threshold: float):
  """Weighted means within clusters, then their plain mean: (aggregate, clusters)."""
  labels = components(p, threshold)
  w = np.asarray(w, np.float64)
  means = [weighted_sum(w[labels == c], np.asarray(p)[labels == c]) / w[labels == c].sum()
           for c in np.unique(labels)]
  return np.mean(means, axis=0), len(means)


def weiszfeld(p, w, iters: int, eps: float):
  """Smoothed Weiszfeld from the weighted mean."""
  p, w = np.asarray(p, np.float64), np.asarray(w, np.float64)
  z = (w[:, None] * p).sum(0) / w.sum()
  for _ in range(iters):
    beta = w / np.maximum(eps, np.linalg.norm(p - z, axis=1))
    z = (beta[:, None] * p).sum(0) / beta.sum()
  return z


def centered_clip(p, center, tau: float, iters: int):
  """Centred clipping, uniform over the participants: (v, clipped in the last step)."""
  v = np.asarray(center, np.float64)
  p = np.asarray(p, np.float64)
  clipped = 0
  for _ in range(iters):
    diff = p - v
    norm = np.linalg.norm(diff, axis=1)
    clipped = int(np.sum(norm > tau))
    v = v + (diff * np.minimum(1.0, tau / np.maximum(norm, 1e-30))[:, None]).mean(0)
  return v, clipped


def bounded_contrastive(p, g, prev, mu1: float, mu2: float, r2: float):
  """TopkSDP-FL's bounded contrastive term and its gradient in p:
  mu1/2 ||p - g||^2 - mu2/2 min(||p - prev||^2, r2)."""
  p, g, prev = (np.asarray(a, np.float64) for a in (p, g, prev))
  d2 = np.sum((p - prev) ** 2)
  value = 0.5 * mu1 * np.sum((p - g) ** 2) - 0.5 * mu2 * min(d2, r2)
  inside = 1.0 if d2 < r2 else 0.5 if d2 == r2 else 0.0
  return value, mu1 * (p - g) - mu2 * inside * (p - prev)
