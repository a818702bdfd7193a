"""Index selection for sparsification: which k of d coordinates a client sends.

All return a bool mask [d] with exactly k True entries.

  topk_mask_exact      lax.top_k of |x|: the k largest magnitudes (ties by index)
  topk_mask_approx     lax.approx_max_k of |x| (TPU-friendly; on CPU and GPU it
                       falls back to an exact sort-based top-k)
  topk_mask_threshold  keeps |x| >= t, t the (1 - k/d) quantile of a random sample
                       of |x|, then trims or pads to exactly k: O(d) passes, no sort
  random_k_mask        k coordinates uniformly at random (from the key alone:
                       the indices leak nothing about the update)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _mask_from_indices(idx: jax.Array, d: int) -> jax.Array:
  return jnp.zeros((d,), bool).at[idx].set(True)


def topk_mask_exact(x: jax.Array, k: int) -> jax.Array:
  _, idx = jax.lax.top_k(jnp.abs(x), k)
  return _mask_from_indices(idx, x.shape[0])


def topk_mask_approx(x: jax.Array, k: int, recall_target: float = 0.95) -> jax.Array:
  _, idx = jax.lax.approx_max_k(jnp.abs(x), k, recall_target=recall_target)
  return _mask_from_indices(idx, x.shape[0])


def topk_mask_threshold(x: jax.Array, k: int, key: jax.Array, sample: int = 4096) -> jax.Array:
  """Approximate top-k by a sampled quantile threshold, trimmed to exactly k.

  Coordinates at or above the threshold are kept in index order until k are
  kept; if fewer than k pass, the first of the others by index fill up. Exact in
  count, approximate in which: its recall is measured by the benchmark."""
  d = x.shape[0]
  a = jnp.abs(x)
  s = a[jax.random.randint(key, (min(sample, d),), 0, d)]
  t = jnp.quantile(s, 1.0 - k / d)
  above = a >= t
  rank_above = jnp.cumsum(above) * above          # 1..: order among those above
  keep = above & (rank_above <= k)
  short = k - jnp.sum(keep)
  below = ~above
  rank_below = jnp.cumsum(below) * below
  return keep | (below & (rank_below <= short))


def random_k_mask(key: jax.Array, d: int, k: int) -> jax.Array:
  _, idx = jax.lax.top_k(jax.random.uniform(key, (d,)), k)
  return _mask_from_indices(idx, d)
