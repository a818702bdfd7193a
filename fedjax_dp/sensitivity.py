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


def _bin_index(x: jax.Array, lo: jax.Array, hi: jax.Array, bins: int) -> jax.Array:
  width = jnp.maximum(hi - lo, _EPS) / bins
  return jnp.clip(jnp.floor((x - lo) / width), 0, bins - 1).astype(jnp.int32)


def histogram(x: jax.Array, lo: jax.Array, hi: jax.Array, bins: int) -> jax.Array:
  """Counts [bins] of x [n] in equal bins of [lo, hi] (outside values go to the ends)."""
  idx = _bin_index(x, lo, hi, bins)
  return jnp.sum(idx[:, None] == jnp.arange(bins)[None, :], axis=0).astype(jnp.float32)


def shannon_entropy(x: jax.Array, bins: int = 16) -> jax.Array:
  """Plug-in entropy (nats) of one feature x [n]."""
  c = histogram(x, jnp.min(x), jnp.max(x), bins)
  p = c / jnp.maximum(jnp.sum(c), 1.0)
  return -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0))


def distinct_values(x: jax.Array) -> jax.Array:
  """Number of distinct values of x [n] (values closer than 1e-6 of the range merge)."""
  s = jnp.sort(x)
  tol = 1e-6 * jnp.maximum(s[-1] - s[0], _EPS)
  return 1 + jnp.sum(jnp.diff(s) > tol, dtype=jnp.int32)


def kde_entropy(x: jax.Array) -> jax.Array:
  """Leave-one-out Gaussian-KDE differential entropy (nats) of x [n], n >= 2."""
  n = x.shape[0]
  sd = jnp.maximum(jnp.std(x), _EPS)
  h = 1.06 * sd * n ** (-0.2)
  z = (x[:, None] - x[None, :]) / h
  k = jnp.exp(-0.5 * z * z) / (h * math.sqrt(2 * math.pi))
  k = k * (1.0 - jnp.eye(n, dtype=k.dtype))
  f = jnp.sum(k, axis=1) / (n - 1)
  return -jnp.mean(jnp.log(jnp.maximum(f, 1e-30)))


def max_abs_correlation(x: jax.Array, s: jax.Array) -> jax.Array:
  """[F]: max over sensitive columns s [n, S] of |Pearson r(x_f, s_k)| (0 for a constant)."""
  xc = x - jnp.mean(x, axis=0)
  sc = s - jnp.mean(s, axis=0)
  cov = xc.T @ sc                                                    # [F, S]
  norm = jnp.sqrt(jnp.sum(xc * xc, axis=0))[:, None] * jnp.sqrt(jnp.sum(sc * sc, axis=0))[None, :]
  r = jnp.where(norm > _EPS, cov / jnp.maximum(norm, _EPS), 0.0)
  return jnp.max(jnp.abs(r), axis=1)


def kl_to_reference(x: jax.Array, ref: jax.Array, bins: int = 32) -> jax.Array:
  """KL(p_x || p_ref) (nats) of one feature, histograms over the reference's range,
  each bin's count + 1/2."""
  lo, hi = jnp.min(ref), jnp.max(ref)
  p = histogram(x, lo, hi, bins) + 0.5
  q = histogram(ref, lo, hi, bins) + 0.5
  p, q = p / jnp.sum(p), q / jnp.sum(q)
  return jnp.sum(p * jnp.log(p / q))


def statistical_scores(x: jax.Array, sensitive: jax.Array, reference: jax.Array,
                       bins: int = 16) -> dict:
  """Per-feature statistics of one client's x [n, F] and their [0, 1] scores.

  sensitive [n, S]: the client's sensitive attributes; reference [m, F]: the
  reference distribution (e.g. public or pooled data). Returns a dict of [F]
  arrays: entropy (nats; Shannon for discrete features, KDE for continuous),
  discrete, correlation, kl, and entropy_score, correlation_score, kl_score,
  score (their mean)."""
  def per_feature(col, ref_col):
    distinct = distinct_values(col)
    discrete = distinct <= bins
    h_disc = shannon_entropy(col, bins)
    h_cont = kde_entropy(col)
    var = jnp.maximum(jnp.var(col), _EPS)
    power = jnp.exp(2.0 * h_cont) / (2 * math.pi * math.e * var)
    e_score = jnp.where(discrete, h_disc / jnp.log(jnp.maximum(distinct, 2)),
                        jnp.clip(power, 0.0, 1.0))
    return (jnp.where(discrete, h_disc, h_cont), discrete, e_score,
            kl_to_reference(col, ref_col))

  entropy, discrete, e_score, kl = jax.vmap(per_feature, in_axes=(1, 1))(x, reference)
  corr = max_abs_correlation(x, sensitive)
  kl_score = 1.0 - jnp.exp(-kl)
  return {"entropy": entropy, "discrete": discrete, "correlation": corr, "kl": kl,
          "entropy_score": e_score, "correlation_score": corr, "kl_score": kl_score,
          "score": (e_score + corr + kl_score) / 3.0}
