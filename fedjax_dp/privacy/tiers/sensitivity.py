"""The sensitivity analyzer's statistical branch (dynamic-DP paper, section 3.2).

Per feature (column) of one client's local data x [n, F], all jittable:

  shannon_entropy        plug-in entropy of the value histogram, -sum_b p_b ln p_b,
                         over `bins` equal bins of [min, max] (exact for a discrete
                         feature with at most `bins` evenly spaced values)
  kde_entropy            differential entropy by Gaussian KDE, the leave-one-out
                         resubstitution estimate -1/n sum_i ln f_{-i}(x_i), with
                         Silverman's bandwidth h = 1.06 sd n^(-1/5)
  max_abs_correlation    max over the sensitive attributes s [n, S] of |Pearson r|
  kl_to_reference        KL(client || reference) between histograms on the
                         reference's bins (add-half smoothing)

and their [0, 1] normalizations (`statistical_scores`):

  entropy     discrete features (<= `bins` distinct values): H / ln(distinct);
              continuous: the entropy power exp(2 h) / (2 pi e var), which is 1
              for a Gaussian (the largest entropy at that variance) and falls
              towards 0 as the feature concentrates on few values
  correlation |r| as is
  divergence  1 - exp(-KL)

The statistical score of a feature is the mean of the three. The paper gives
the statistics but not how they combine; the mean is our choice.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

_EPS = 1e-12


def _mask(x: jax.Array, mask: jax.Array | None) -> jax.Array:
  return jnp.ones(x.shape[0], jnp.float32) if mask is None else mask.astype(jnp.float32)


def _masked_min_max(x, m):
  return jnp.min(jnp.where(m > 0, x, jnp.inf)), jnp.max(jnp.where(m > 0, x, -jnp.inf))


def _bin_index(x: jax.Array, lo: jax.Array, hi: jax.Array, bins: int) -> jax.Array:
  width = jnp.maximum(hi - lo, _EPS) / bins
  return jnp.clip(jnp.floor((x - lo) / width), 0, bins - 1).astype(jnp.int32)


def histogram(x: jax.Array, lo: jax.Array, hi: jax.Array, bins: int,
              mask: jax.Array | None = None) -> jax.Array:
  """Counts [bins] of x [n] (rows with mask 0 left out) in equal bins of [lo, hi]
  (outside values go to the ends)."""
  idx = _bin_index(x, lo, hi, bins)
  onehot = (idx[:, None] == jnp.arange(bins)[None, :]).astype(jnp.float32)
  return _mask(x, mask) @ onehot


def shannon_entropy(x: jax.Array, bins: int = 16, mask: jax.Array | None = None) -> jax.Array:
  """Plug-in entropy (nats) of one feature x [n]."""
  m = _mask(x, mask)
  lo, hi = _masked_min_max(x, m)
  c = histogram(x, lo, hi, bins, m)
  p = c / jnp.maximum(jnp.sum(c), 1.0)
  return -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0))


def distinct_values(x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """Number of distinct values of x [n] (values closer than 1e-6 of the range merge)."""
  m = _mask(x, mask)
  k = jnp.sum(m > 0)
  s = jnp.sort(jnp.where(m > 0, x, jnp.inf))       # the k real values first
  lo, hi = s[0], s[jnp.maximum(k - 1, 0)]
  tol = 1e-6 * jnp.maximum(hi - lo, _EPS)
  steps = (jnp.diff(s) > tol) & (jnp.arange(1, x.shape[0]) < k)
  return jnp.minimum(k, 1) + jnp.sum(steps, dtype=jnp.int32)


def kde_entropy(x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """Leave-one-out Gaussian-KDE differential entropy (nats) of x [n], n >= 2."""
  m = _mask(x, mask)
  n = jnp.maximum(jnp.sum(m), 2.0)
  mean = jnp.sum(m * x) / n
  sd = jnp.maximum(jnp.sqrt(jnp.sum(m * (x - mean) ** 2) / n), _EPS)
  h = 1.06 * sd * n ** (-0.2)
  z = (x[:, None] - x[None, :]) / h
  k = jnp.exp(-0.5 * z * z) / (h * math.sqrt(2 * math.pi))
  k = k * (1.0 - jnp.eye(x.shape[0], dtype=k.dtype)) * m[None, :]
  f = jnp.sum(k, axis=1) / (n - 1)
  return -jnp.sum(m * jnp.log(jnp.maximum(f, 1e-30))) / n


def max_abs_correlation(x: jax.Array, s: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """[F]: max over sensitive columns s [n, S] of |Pearson r(x_f, s_k)| (0 for a
  constant, and for S = 0)."""
  if s.shape[1] == 0:
    return jnp.zeros(x.shape[1], jnp.float32)
  m = _mask(x, mask)[:, None]
  n = jnp.maximum(jnp.sum(m), 1.0)
  xc = (x - jnp.sum(m * x, axis=0) / n) * m
  sc = (s - jnp.sum(m * s, axis=0) / n) * m
  cov = xc.T @ sc                                                    # [F, S]
  norm = jnp.sqrt(jnp.sum(xc * xc, axis=0))[:, None] * jnp.sqrt(jnp.sum(sc * sc, axis=0))[None, :]
  r = jnp.where(norm > _EPS, cov / jnp.maximum(norm, _EPS), 0.0)
  return jnp.max(jnp.abs(r), axis=1)


def reference_histogram(ref: jax.Array, bins: int = 32):
  """(lo, hi, q [bins]) of one reference feature: its range and smoothed bin
  frequencies (each count + 1/2), for `kl_to_histogram`."""
  lo, hi = jnp.min(ref), jnp.max(ref)
  q = histogram(ref, lo, hi, bins) + 0.5
  return lo, hi, q / jnp.sum(q)


def kl_to_histogram(x: jax.Array, lo, hi, q: jax.Array, mask: jax.Array | None = None):
  """KL(p_x || q) with p_x binned like `reference_histogram`'s q."""
  p = histogram(x, lo, hi, q.shape[0], mask) + 0.5
  p = p / jnp.sum(p)
  return jnp.sum(p * jnp.log(p / q))


def kl_to_reference(x: jax.Array, ref: jax.Array, bins: int = 32,
                    mask: jax.Array | None = None) -> jax.Array:
  """KL(p_x || p_ref) (nats) of one feature, histograms over the reference's range,
  each bin's count + 1/2."""
  return kl_to_histogram(x, *reference_histogram(ref, bins), mask)


def statistical_scores(x: jax.Array, sensitive: jax.Array, reference,
                       bins: int = 16, mask: jax.Array | None = None) -> dict:
  """Per-feature statistics of one client's x [n, F] and their [0, 1] scores.

  sensitive [n, S]: the client's sensitive attributes; reference [m, F]: the
  reference distribution (e.g. public data, or a standard normal for
  standardized features), or its per-feature `reference_histogram`s (lo [F],
  hi [F], q [F, bins]) computed once for many clients; mask [n]: which rows are
  real (padding has 0).
  Returns a dict of [F] arrays: entropy (nats; Shannon for discrete features,
  KDE for continuous), discrete, correlation, kl, and entropy_score,
  correlation_score, kl_score, score (their mean)."""
  m = _mask(x, mask)

  if not isinstance(reference, tuple):
    reference = jax.vmap(reference_histogram, in_axes=1)(reference)

  def per_feature(col, lo, hi, q):
    distinct = distinct_values(col, m)
    discrete = distinct <= bins
    h_disc = shannon_entropy(col, bins, m)
    h_cont = kde_entropy(col, m)
    n = jnp.maximum(jnp.sum(m), 1.0)
    mean = jnp.sum(m * col) / n
    var = jnp.maximum(jnp.sum(m * (col - mean) ** 2) / n, _EPS)
    power = jnp.exp(2.0 * h_cont) / (2 * math.pi * math.e * var)
    e_score = jnp.where(discrete, h_disc / jnp.log(jnp.maximum(distinct, 2)),
                        jnp.clip(power, 0.0, 1.0))
    return (jnp.where(discrete, h_disc, h_cont), discrete, e_score,
            kl_to_histogram(col, lo, hi, q, m))

  entropy, discrete, e_score, kl = jax.vmap(per_feature, in_axes=(1, 0, 0, 0))(x, *reference)
  corr = max_abs_correlation(x, sensitive, m)
  kl_score = 1.0 - jnp.exp(-kl)
  return {"entropy": entropy, "discrete": discrete, "correlation": corr, "kl": kl,
          "entropy_score": e_score, "correlation_score": corr, "kl_score": kl_score,
          "score": (e_score + corr + kl_score) / 3.0}
