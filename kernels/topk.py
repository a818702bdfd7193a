"""Index selection for sparsification: which k of d coordinates a client sends.

All return a bool mask [d] with exactly k True entries, except `topk_mask_bisect`
(between 0.999 k and k).

  topk_mask_exact      lax.top_k of |x|: the k largest magnitudes (ties by index)
  topk_mask_approx     lax.approx_max_k of |x| (TPU-friendly; on CPU and GPU it
                       falls back to an exact sort-based top-k)
  topk_mask_threshold  keeps |x| >= t, t the (1 - k/d) quantile of a random sample
                       of |x|, then trims or pads to exactly k: O(d) passes, no sort
  topk_mask_bisect     keeps |x| >= t, t found from a sampled bracket by counting
                       passes until count(|x| >= t) is within 0.1 % of k (at most k):
                       the exact top-c for such a c; exactly k, filled in index
                       order, where ties at the k-th value stop the search short
                       (the fastest on CPU, see BENCHMARKS.md)
  random_k_mask        k coordinates uniformly at random (from the key alone:
                       the indices leak nothing about the update)
"""

from __future__ import annotations

import math

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


def _count_true(mask: jax.Array, axis=None) -> jax.Array:
  """int32 count of True (along `axis`). Summed in float32 where that is exact
  (every partial sum below 2^24): XLA:CPU reduces float32 about twice as fast as
  int32 (28 vs 55 us for 199,210 values), and the threshold search is passes of
  this count."""
  n = mask.size if axis is None else mask.shape[axis]
  if n < 2 ** 24:
    return jnp.sum(mask.astype(jnp.float32), axis=axis).astype(jnp.int32)
  return jnp.sum(mask, axis=axis, dtype=jnp.int32)


def count_at_least(a: jax.Array, t: jax.Array, axis=None) -> jax.Array:
  """int32 count of a >= t (along `axis`), summed as _count_true."""
  return _count_true(a >= t, axis)


def sample_rank_bracket(s: jax.Array, ranks: jax.Array, steps: int = 20):
  """(lo, hi) around the rank-th largest values of a sample s [n] >= 0 (finite).

  ranks [2] (floats, lo's rank >= hi's): lo counts >= ranks[0] values of s at or
  above it, hi counts < ranks[1]. Bisection on the floats' bit patterns (order-
  preserving for s >= 0) from [min(s), max(s)]: with enough steps (about 30)
  lo is exactly the ranks[0]-th largest value and hi the threshold just above
  the ranks[1]-th (_just_above); after `steps` each side is at most
  (max - min) / 2^steps bit patterns wider (20 steps: about 1e-5 of the value for a typical update),
  which the counting passes over the full array then narrow."""
  bits = jax.lax.bitcast_convert_type(s, jnp.int32)

  def step(_, b):
    lo_b, hi_b = b   # count(s >= lo_b) >= rank, and the largest such value <= hi_b
    mid = lo_b + (hi_b - lo_b + 1) // 2
    ok = count_at_least(bits[None, :], mid[:, None], axis=1) >= ranks
    return jnp.where(ok, mid, lo_b), jnp.where(ok, hi_b, mid - 1)

  # derived from the data, so that inside shard_map the carry is as device-varying as s
  start = (jnp.broadcast_to(jnp.min(bits), (2,)), jnp.broadcast_to(jnp.max(bits), (2,)))
  lo_b, hi_b = jax.lax.fori_loop(0, steps, step, start)
  return (jax.lax.bitcast_convert_type(lo_b[0], jnp.float32),
          _just_above(jax.lax.bitcast_convert_type(hi_b[1], jnp.float32)))


def _normal_or_zero(t: jax.Array) -> jax.Array:
  """t >= 0, raised to float32's smallest normal when it is a positive subnormal.

  XLA:CPU compares with subnormals flushed to zero, so |x| >= t for a subnormal
  t is |x| >= 0 and keeps everything (an all-zero vector's 'just above the
  largest value' is the smallest subnormal). Every |x| below the smallest
  normal compares as 0 anyway, so the raised t keeps the same set that an
  exact comparison with t would."""
  # on the bit patterns: compared as floats, a subnormal t is 0 here
  bits = jax.lax.bitcast_convert_type(t, jnp.int32)
  tiny = jax.lax.bitcast_convert_type(jnp.finfo(jnp.float32).tiny, jnp.int32)
  raised = jnp.where((bits > 0) & (bits < tiny), tiny, bits)
  return jax.lax.bitcast_convert_type(raised, jnp.float32)


def magnitude_at_least(x: jax.Array, t: jax.Array) -> jax.Array:
  """|x| >= t for t >= 0, without forming |x|: (x >= t) | (x <= -t) (NaN: False)."""
  return (x >= t) | (x <= -t)


def count_magnitude_at_least(x: jax.Array, t: jax.Array) -> jax.Array:
  """int32 count of |x| >= t (t >= 0), summed as _count_true."""
  return _count_true(magnitude_at_least(x, t))


# float32 +inf's bit pattern. One more, _ABOVE_ALL_BITS, is a NaN pattern used as
# the threshold above everything: every comparison with it is false, so it counts 0.
_INF_BITS = 0x7F800000
_ABOVE_ALL_BITS = _INF_BITS + 1
_FMAX = float(jnp.finfo(jnp.float32).max)


def _bits(t: jax.Array) -> jax.Array:
  return jax.lax.bitcast_convert_type(t, jnp.int32)


def _just_above(v: jax.Array) -> jax.Array:
  """The threshold just above v in [0, fmax]: the next float (raised to the smallest
  normal, _normal_or_zero), or above everything (a NaN pattern, every comparison
  false, so it counts 0) past fmax: +inf would count the infinities."""
  nxt = _bits(v) + 1
  return _normal_or_zero(jax.lax.bitcast_convert_type(
      jnp.where(nxt >= _INF_BITS, _ABOVE_ALL_BITS, nxt), jnp.float32))


def _search_bracket(count, sample_at, largest_finite, d: int, k: int, key: jax.Array,
                    sample: int, passes: int, tol: float):
  """kth_largest_threshold's search over values v_0..v_{d-1} >= 0 seen only through
  count(t) = #{v >= t}, sample_at(idx) = v[idx] and largest_finite() = the largest
  finite v (0 if none), where NaN values are never counted (every comparison
  with NaN is false).

  The search runs in [0, fmax] (+inf counts at every threshold there as fmax
  does, so infinities are a tie at the top) plus the threshold above all, which
  counts 0;
  NaN sample values are read as 0. Returns (lo, hi, c_lo, c_hi): c_hi =
  count(hi) <= k, and c_lo = count(lo) > k unless fewer than k + 1 values are
  not NaN, or k >= d (then hi = lo = 0 and both count d)."""
  if k >= d:
    return jnp.float32(0.0), jnp.float32(0.0), jnp.int32(d), jnp.int32(d)
  lo, hi, c_lo, c_hi = _sample_bracket(count, sample_at, d, k, key, sample)

  def below_the_top(lo, hi, c_lo, c_hi):
    # hi above everything leaves the secant nothing finite to work with: bring it
    # down to just above the largest finite value (counting the infinities), or,
    # when the infinities alone are more than k, make the tie at the top the
    # bracket (two passes, only when the sample missed or saw infinities)
    top = _just_above(largest_finite())
    c_top = count(top)
    fits = c_top <= k
    return (jnp.where(fits, lo, _FMAX), jnp.where(fits, top, hi),
            jnp.where(fits, c_lo, count(jnp.float32(_FMAX))), jnp.where(fits, c_top, c_hi))

  lo, hi, c_lo, c_hi = jax.lax.cond(_bits(hi) > _INF_BITS, below_the_top,
                                    lambda *b: b, lo, hi, c_lo, c_hi)

  return _refine_bracket(count, lo, hi, c_lo, c_hi, k, passes, tol)


def _sample_bracket(count, sample_at, d: int, k: int, key: jax.Array, sample: int):
  """_search_bracket's start: (lo, hi, c_lo, c_hi) from the ranks around k of a
  systematic sample, each end replaced by the whole range's where the sample missed."""
  # a systematic sample from a random start: one random number, not `sample`
  stride = max(1, d // sample)
  n = d // stride
  offset = jax.random.randint(key, (), 0, d - n * stride + 1)
  s = sample_at(offset + stride * jnp.arange(n))
  s = jnp.where(jnp.isnan(s), 0.0, jnp.minimum(s, _FMAX))
  p = k / d
  # the sample is the whole array when d <= sample: then its k-th largest is exact
  half = 4.0 * math.sqrt(max(p * (1 - p) * n, 1.0)) if stride > 1 else 0.0
  ranks = jnp.asarray([min(n, p * n + half), max(1.0, p * n - half)], jnp.float32)  # lo, hi
  lo, hi = sample_rank_bracket(s, ranks, steps=32 if stride == 1 else 20)
  c_lo, c_hi = count(lo), count(hi)
  # where the sample missed, fall back to the whole range: hi must count <= k, lo > k
  above_all = jax.lax.bitcast_convert_type(jnp.int32(_ABOVE_ALL_BITS), jnp.float32)
  hi_missed = c_hi > k
  hi, c_hi = jnp.where(hi_missed, above_all, hi), jnp.where(hi_missed, 0, c_hi)
  lo_missed = c_lo <= k                   # then lo is the better hi (and hi was not missed)
  hi, c_hi = jnp.where(lo_missed, lo, hi), jnp.where(lo_missed, c_lo, c_hi)
  lo, c_lo = jnp.where(lo_missed, 0.0, lo), jnp.where(lo_missed, d, c_lo)
  return lo, hi, c_lo, c_hi


def _refine_bracket(count, lo, hi, c_lo, c_hi, k: int, passes: int, tol: float):
  """_search_bracket's passes: secant and bisection steps on a bracket (c_hi <= k <
  c_lo) until hi keeps at least (1 - tol) k values, or `passes` run out."""
  # Stop once hi keeps at least `enough`; the secant aims at the middle of
  # [enough, k], so that it tends to land inside; every third pass bisects, so
  # the bracket at least halves every three passes whatever the distribution.
  enough = min(k, math.ceil((1.0 - tol) * k))
  aim = 0.5 * (enough + k)
  tiny = _bits(jnp.float32(jnp.finfo(jnp.float32).tiny))

  def hi_bits(hi):   # above all's stand-in in arithmetic: +inf's pattern, just past fmax
    return jnp.minimum(_bits(hi), _INF_BITS)

  def searching(b):
    i, lo, hi, _, c_hi = b
    # nothing left between: adjacent floats, or 0 and the smallest normal (values
    # below it compare as 0 on XLA:CPU; elsewhere subnormals then join the fill)
    adjacent = ((hi_bits(hi) - _bits(lo) <= 1)
                | ((_bits(lo) == 0) & (_bits(hi) <= tiny)))
    return (i < passes) & (c_hi < enough) & ~adjacent

  def refine(b):
    i, lo, hi, c_lo, c_hi = b
    top = jnp.where(_bits(hi) > _INF_BITS, _FMAX, hi)     # finite: no inf - inf, no overflow
    frac = (c_lo - aim) / jnp.maximum(c_lo - c_hi, 1).astype(jnp.float32)
    mid = jnp.where(i % 3 == 2, lo + 0.5 * (top - lo),
                    lo + (top - lo) * jnp.clip(frac, 1 / 64, 63 / 64))
    # rounding can land on an end: then halve the bracket's bit patterns
    inside = (_bits(mid) > _bits(lo)) & (_bits(mid) < hi_bits(hi))
    mid = jnp.where(inside, mid, jax.lax.bitcast_convert_type(
        _bits(lo) + (hi_bits(hi) - _bits(lo)) // 2, jnp.float32))
    c = count(mid)
    fits = c <= k
    return (i + 1, jnp.where(fits, lo, mid), jnp.where(fits, mid, hi),
            jnp.where(fits, c_lo, c), jnp.where(fits, c, c_hi))

  _, lo, hi, c_lo, c_hi = jax.lax.while_loop(searching, refine,
                                             (jnp.int32(0), lo, hi, c_lo, c_hi))
  return lo, hi, c_lo, c_hi


def kth_largest_threshold(a: jax.Array, k: int, key: jax.Array, sample: int = 4096,
                          passes: int = 12, tol: float = 0.0) -> jax.Array:
  """A threshold t with count(a >= t) <= k, within `tol` of k if `passes` allow.

  a [d] >= 0. No sort (XLA's CPU sort is slow): the (1 - k/d) quantile of a
  systematic sample of `sample` values from a random start (sample_rank_bracket)
  gives a bracket [lo, hi] around the k-th largest value (rank +- 4 standard
  errors; exact when d <= sample).
  The bracket is checked on the full array (and widened to [0, max] when the
  sample missed), then narrowed by counting passes over the full array, secant
  steps on the empirical CDF with a bisection every third pass, until
  count(a >= hi) >= (1 - tol) k, the bracket is two adjacent floats (a tie at
  the k-th value) or `passes` are spent. `hi` always counts <= k, so the result
  never keeps more than k; with tol = 0 and enough passes it is the exact k-th
  largest."""
  return _search_bracket(lambda t: count_at_least(a, t), lambda idx: a[idx],
                         lambda: jnp.max(jnp.where(a <= _FMAX, a, 0.0)), a.shape[0], k, key,
                         sample, passes, tol)[1]


def kth_largest_magnitude(x: jax.Array, k: int, key: jax.Array, sample: int = 4096,
                          passes: int = 12, tol: float = 0.0) -> jax.Array:
  """kth_largest_threshold(|x|, ...), the same value, without forming |x|: each
  counting pass compares x itself against +-t (|x| would be one more pass over
  the array to write, then read by every count)."""
  return _magnitude_bracket(x, k, key, sample, passes, tol)[1]


def _magnitude_bracket(x, k, key, sample, passes, tol):
  return _search_bracket(lambda t: count_magnitude_at_least(x, t),
                         lambda idx: jnp.abs(x[idx]),
                         lambda: jnp.max(jnp.where(jnp.abs(x) <= _FMAX, jnp.abs(x), 0.0)),
                         x.shape[0], k, key, sample, passes, tol)


BISECT_TOL = 1e-3


def topk_mask_bisect(x: jax.Array, k: int, key: jax.Array, passes: int = 12,
                     tol: float = BISECT_TOL) -> jax.Array:
  """k of the largest |x| by a threshold search (kth_largest_magnitude), no sort.

  Usually the exact top c for (1 - tol) k <= c <= k: the search stops as soon as
  its threshold keeps that many. Where it cannot get there (many |x| tie at the
  k-th value, e.g. coordinates at a clipping bound, or the passes ran out), it
  keeps the c it has plus the first k - c by index of the values in its last
  bracket [lo, hi), all at least as large as any value left out of it: then
  exactly k, the exact top k up to the order within that bracket (for a tie, up
  to which of the tied coordinates, as lax.top_k's lowest index first). The
  fill is a prefix count over d, done only then."""
  lo, hi, c_lo, c_hi = _magnitude_bracket(x, k, key, 4096, passes, tol)
  keep = magnitude_at_least(x, hi)
  enough = min(k, math.ceil((1.0 - tol) * k))

  def fill():
    band = magnitude_at_least(x, lo) & ~keep
    rank = jnp.cumsum(band, dtype=jnp.int32)
    return keep | (band & (rank <= k - c_hi))

  return jax.lax.cond((c_hi < enough) & (c_lo > c_hi), fill, lambda: keep)


def random_k_mask(key: jax.Array, d: int, k: int) -> jax.Array:
  _, idx = jax.lax.top_k(jax.random.uniform(key, (d,)), k)
  return _mask_from_indices(idx, d)
