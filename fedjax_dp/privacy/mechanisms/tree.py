"""DP-FTRL with tree aggregation (Kairouz et al. 2021), restarted every epoch as in
their Appendix D.

The binary tree's nodes are released as they complete: round c of an epoch
(1-based) completes the node over its last 2^tz(c) rounds (tz: trailing zeros of
c), released with fresh noise xi_c ~ N(0, (z sens C)^2). A prefix sum is the sum
of the completed nodes that tile it, so its noise is theirs; the model follows the
prefix sums, so round c's update carries the difference of two prefix noises:
xi_c minus the nodes it replaces (those below level tz(c)), kept in one buffer per
level, floor(log2(epoch)) + 1 model-sized buffers in all. This is the matrix
mechanism with C the tree's completed-node matrix (C^{-1} xi streamed), and the
plain binary tree (not Honaker's variance-reduced estimator).

An epoch is the sampler's min_sep rounds (sampling 'cyclic': num_clients /
clients_per_round), so each client takes part once per tree. A leaf is in at most
floor(log2(epoch)) + 1 completed nodes (the epoch's first, at every level), so a
tree's sensitivity^2 is that (the last, shorter tree's by its own length), and
the restarted trees are independent: the run's sensitivity^2 is their sum, each
charged when its tree starts. Restarting is what keeps this honest: a tree over
several participations of a client would sum its columns.
"""

from __future__ import annotations

import numpy as np

from fedjax_dp.privacy.mechanisms import correlated


def levels(length: int) -> int:
  """Buffers of a tree over `length` rounds, and the most completed nodes a leaf is
  in: floor(log2(length)) + 1."""
  return int(length).bit_length()


def _tz(c):
  """Trailing zeros of a positive int32 c: log2 of its lowest set bit (exact: a
  power of two is exact in float32 up to 2^31)."""
  import jax.numpy as jnp
  return jnp.round(jnp.log2((c & -c).astype(jnp.float32))).astype(jnp.int32)


def tree_inverse(epoch: int):
  """The tree's streamed C^{-1} (jax-privacy's StreamingMatrix protocol): state per
  parameter leaf (round index, [levels, ...] node buffers); restarted every `epoch`
  rounds."""
  import jax.numpy as jnp
  from jax_privacy.matrix_factorization import streaming_matrix
  depth = levels(epoch)

  def init(abstract):
    return jnp.int32(0), jnp.zeros((depth,) + tuple(abstract.shape), jnp.float32)

  def next_(xi, state):
    index, bufs = state
    bufs = jnp.where(index % epoch == 0, 0.0, bufs)          # a new tree
    tz = _tz(index % epoch + 1)
    below = (jnp.arange(depth) < tz).reshape((depth,) + (1,) * xi.ndim)
    out = xi - jnp.sum(jnp.where(below, bufs, 0.0), axis=0)
    bufs = jnp.where(below, 0.0, bufs)
    bufs = bufs.at[tz].set(xi.astype(jnp.float32))
    return out, (index + 1, bufs)
  return streaming_matrix.StreamingMatrix.from_array_implementation(init, next_)


def strategy_for(settings: dict, participation, rounds: int) -> correlated.Strategy:
  """Trees of min_sep rounds restarted (the last one shorter): their sensitivities,
  each charged as its tree starts."""
  epoch = max(1, min(participation.min_sep, rounds))
  starts = list(range(0, rounds, epoch))
  points = [min(rounds, s + epoch) for s in starts]
  sens2 = np.cumsum([levels(p - s) for s, p in zip(starts, points)]).astype(np.float64)
  inverse = tree_inverse(epoch)
  return correlated.Strategy(
      "tree", inverse, float(sens2[-1]), correlated.charges_from_prefixes(rounds, points, sens2),
      f"binary tree aggregation restarted every {epoch} round{'s' * (epoch > 1)} "
      f"({len(starts)} tree{'s' * (len(starts) > 1)}, {levels(epoch)} levels)",
      *correlated.error_factors(inverse, rounds))


def tree():
  return correlated.mechanism(
      "tree", strategy_for,
      "DP-FTRL with tree aggregation (Kairouz et al. 2021, restarted every min_sep rounds; "
      "user level): each client's update clipped to L2 norm clip_norm by the server, each "
      "completed tree node noised with N(0, (z sens clip_norm)^2), the rounds following the "
      "noisy prefix sums, divided by clients_per_round")
