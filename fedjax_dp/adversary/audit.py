"""Empirical privacy audit with canary clients (one-shot, Andrew et al. 2023).

`audit_canaries` = K of the clients (drawn from the data seed, apart from every
other draw) are canaries: whenever one takes part, its upload, before the DP
mechanism's clip and noise, is clip_norm * c_i, with c_i a fixed random unit
direction of its own (a normal vector from fold_in(canary key, id), normalised).
The mechanism then treats it as any upload. K more directions, never inserted
(ids num_clients, num_clients + 1, ...), are held out.

After training, each direction's cosine with the final model's change
Delta = theta_T - theta_0 is the test statistic. If the release were perfectly
private, inserted and held-out cosines would be alike; the audit fits a normal to
each set (N(mu_in, s_in), N(mu_out, s_out)) and reports the epsilon at which
these two distributions are (epsilon, delta)-indistinguishable, with a bootstrap
confidence interval over the canaries. For the Gaussian mechanism with every
client in every round and a plain server step this is the accounted epsilon
itself (Poisson sampling, charged for adding or removing a client: mu_in -
mu_out over s is sqrt(T) / z); sampling, other clients'
updates and releasing only the final model make it smaller. It is an estimate,
not a proof: an estimate above the accounted epsilon beyond its interval says
the accountant charged less than the mechanism released.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from scipy.stats import norm

CANARY_DRAW = 2**20 + 3     # folded into the data seed: which clients are canaries
CANARY_KEY = 2**20 + 4      # and their directions
MIN_CANARIES = 10           # fewer give no spread to fit


def canary_clients(num_clients: int, count: int, seed: int) -> np.ndarray:
  """bool [num_clients]: the `count` canary clients, by a seeded permutation."""
  perm = np.random.default_rng([seed, CANARY_DRAW]).permutation(num_clients)
  out = np.zeros(num_clients, bool)
  out[perm[:count]] = True
  return out


def canary_key(seed: int) -> jax.Array:
  """The directions' key: public (the data seed's), never the run key."""
  return jax.random.fold_in(jax.random.PRNGKey(seed), CANARY_KEY)


def directions(key: jax.Array, ids: jax.Array, d: int) -> jax.Array:
  """[len(ids), d] unit vectors, row i from fold_in(key, ids[i])."""
  def one(i):
    v = jax.random.normal(jax.random.fold_in(key, i), (d,), jnp.float32)
    return v / jnp.linalg.norm(v)
  return jax.vmap(one)(ids)


def make_canary_stage(num_clients: int, count: int, seed: int):
  """The round's stage: (uploads [m, ...], ids [m], clip_norm, scale) ->
  (uploads, present [m] bool): each canary's upload replaced by scale * clip_norm
  * its direction (scale: the config's audit_canary_scale, in [-1, 1]); at scale
  0 the canaries take no part (present False: the multi-run audit's runs
  without the canary, a neighbouring dataset under add/remove). None without
  canaries."""
  if count <= 0:
    return None
  table = jnp.asarray(canary_clients(num_clients, count, seed))
  key = canary_key(seed)

  def apply(uploads, ids, clip_norm, scale):
    flat = jax.vmap(lambda u: ravel_pytree(u)[0])(uploads)                  # [m, d]
    unravel = ravel_pytree(jax.tree.map(lambda a: a[0], uploads))[1]
    sent = clip_norm * scale * directions(key, ids, flat.shape[1])
    is_canary = table[ids]
    flat = jnp.where(is_canary[:, None], sent.astype(flat.dtype), flat)
    return jax.vmap(unravel)(flat), ~(is_canary & (scale == 0))
  return apply


# ------------------------------------------------------------------ the estimate


def gaussians_delta(eps: float, mu1: float, s1: float, mu0: float, s0: float) -> float:
  """delta(eps) = sup_A P(A) - e^eps Q(A) for P = N(mu1, s1^2), Q = N(mu0, s0^2):
  A = {log p - log q > eps} is where a quadratic is positive, so the sup is exact
  through normal CDFs."""
  a = 1 / (2 * s0 ** 2) - 1 / (2 * s1 ** 2)
  b = mu1 / s1 ** 2 - mu0 / s0 ** 2
  c = -mu1 ** 2 / (2 * s1 ** 2) + mu0 ** 2 / (2 * s0 ** 2) + math.log(s0 / s1) - eps
  def mass(lo, hi, mu, s):   # upper tails by sf: 1 - cdf would cancel to 0 past 1e-16
    if hi == math.inf:
      return norm.sf(lo, mu, s)
    if lo == -math.inf:
      return norm.cdf(hi, mu, s)
    return norm.cdf(hi, mu, s) - norm.cdf(lo, mu, s)
  P = lambda lo, hi: mass(lo, hi, mu1, s1)
  Q = lambda lo, hi: mass(lo, hi, mu0, s0)
  if abs(a) < 1e-12 * max(abs(b), 1e-300):      # equal variances: a half-line
    if b == 0:
      return max(0.0, 1.0 - math.exp(eps)) if c > 0 else 0.0
    r = -c / b
    lo, hi = (r, math.inf) if b > 0 else (-math.inf, r)
    return max(0.0, P(lo, hi) - math.exp(eps) * Q(lo, hi))
  disc = b * b - 4 * a * c
  if disc <= 0:
    return max(0.0, 1.0 - math.exp(eps)) if a > 0 else 0.0
  r1, r2 = sorted(((-b - math.sqrt(disc)) / (2 * a), (-b + math.sqrt(disc)) / (2 * a)))
  if a < 0:
    return max(0.0, P(r1, r2) - math.exp(eps) * Q(r1, r2))
  p = P(-math.inf, r1) + P(r2, math.inf)
  q = Q(-math.inf, r1) + Q(r2, math.inf)
  return max(0.0, p - math.exp(eps) * q)


def gaussians_epsilon(mu1: float, s1: float, mu0: float, s0: float, delta: float,
                      hi: float = 200.0) -> float:
  """The smallest epsilon at which N(mu1, s1^2) and N(mu0, s0^2) are (epsilon,
  delta)-indistinguishable, both ways (bisection; delta(eps) falls with eps)."""
  def eps_one_way(m1, t1, m0, t0):
    if gaussians_delta(0.0, m1, t1, m0, t0) <= delta:
      return 0.0
    lo, up = 0.0, hi
    if gaussians_delta(up, m1, t1, m0, t0) > delta:
      return math.inf
    for _ in range(100):
      mid = (lo + up) / 2
      lo, up = (mid, up) if gaussians_delta(mid, m1, t1, m0, t0) > delta else (lo, mid)
    return up
  return max(eps_one_way(mu1, s1, mu0, s0), eps_one_way(mu0, s0, mu1, s1))


def estimate(inserted: np.ndarray, held_out: np.ndarray, delta: float,
             bootstrap: int = 1000, seed: int = 0) -> dict:
  """The one-shot estimate from the two sets of cosines, and its 95 % bootstrap
  interval (canaries resampled with replacement within each set).

  The two normals share the pooled standard deviation: under the Gaussian
  mechanism they have one (the noise's projection), and fitting two lets a few
  percent of sampling error in the spreads put heavy weight on one tail, which
  at delta = 1e-5 raised the estimate from 11.1 to 15.0 where the mechanism's
  exact epsilon was 11.5 (the README's audit)."""
  if min(len(inserted), len(held_out)) < MIN_CANARIES:
    raise ValueError(f"an audit needs at least {MIN_CANARIES} inserted and held-out canaries; "
                     f"got {len(inserted)} and {len(held_out)}")

  def eps(a, b):
    s = math.sqrt((np.var(a, ddof=1) * (len(a) - 1) + np.var(b, ddof=1) * (len(b) - 1))
                  / (len(a) + len(b) - 2))
    gap = abs(float(np.mean(a)) - float(np.mean(b)))
    if s == 0:     # a resample of identical values: no spread to hide the gap in
      return math.inf if gap > 0 else 0.0
    return gaussians_epsilon(float(np.mean(a)), s, float(np.mean(b)), s, delta)
  rng = np.random.default_rng(seed)
  boots = [eps(rng.choice(inserted, len(inserted)), rng.choice(held_out, len(held_out)))
           for _ in range(bootstrap)]
  # order statistics (inf, past the bisection's 200, stays inf: no interpolation with it)
  lo, hi = np.percentile(boots, [2.5, 97.5], method="nearest")
  return {"empirical_epsilon": eps(inserted, held_out), "ci95": [float(lo), float(hi)],
          "mu_inserted": float(np.mean(inserted)), "sd_inserted": float(np.std(inserted, ddof=1)),
          "mu_held_out": float(np.mean(held_out)), "sd_held_out": float(np.std(held_out, ddof=1)),
          "delta": delta, "bootstrap": bootstrap}


def direction_matrix(num_clients: int, count: int, held_out: int, seed: int,
                     d: int) -> jax.Array:
  """[count + held_out, d]: the inserted canaries' directions (in client order),
  then the held-out ones."""
  ids = np.concatenate([np.flatnonzero(canary_clients(num_clients, count, seed)),
                        num_clients + np.arange(held_out)])
  return directions(canary_key(seed), jnp.asarray(ids, jnp.int32), d)


def cosines(delta_params, num_clients: int, count: int, held_out: int, seed: int):
  """(inserted, held-out) cosines of the model change with the canary directions."""
  flat = np.asarray(ravel_pytree(delta_params)[0], np.float64)
  dirs = np.asarray(direction_matrix(num_clients, count, held_out, seed, flat.shape[0]),
                    np.float64)
  cos = dirs @ (flat / max(np.linalg.norm(flat), 1e-300))
  return cos[:count], cos[count:]


def iterate_tracker(num_clients: int, count: int, held_out: int, seed: int, params0):
  """The all-iterates statistic (Andrew et al. 2023): an observer of every round's
  model takes, for each canary direction, the largest cosine it has with one
  round's model change theta_t - theta_{t-1}.

  Returns (update, result): update(params) after each round; result() ->
  (inserted [count], held-out [held_out]) maxima, float64. Rounds that left the
  model unchanged (skipped) are no observation. Holds the directions on the
  device: (count + held_out) x params floats."""
  flat0 = ravel_pytree(params0)[0]
  dirs = direction_matrix(num_clients, count, held_out, seed, flat0.shape[0])

  @jax.jit   # dirs an argument: closed over, it would be a constant in the program
  def step(dirs, best, prev, params):
    now = ravel_pytree(params)[0].astype(jnp.float32)
    change = now - prev
    size = jnp.linalg.norm(change)
    cos = jnp.matmul(dirs, change, precision=jax.lax.Precision.HIGHEST) / size
    return jnp.where(size > 0, jnp.maximum(best, cos), best), now

  carry = {"best": jnp.full(dirs.shape[0], -jnp.inf, jnp.float32),
           "prev": flat0.astype(jnp.float32)}

  def update(params) -> None:
    carry["best"], carry["prev"] = step(dirs, carry["best"], carry["prev"], params)

  def result():
    best = np.asarray(carry["best"], np.float64)
    return best[:count], best[count:]
  return update, result


# ------------------------------------------------------- the multi-run lower bound


def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
  """The exact one-sided upper confidence bound at level 1 - alpha of a rate seen
  k times in n trials: the p with P(Binomial(n, p) <= k) = alpha."""
  from scipy.stats import beta
  return 1.0 if k >= n else float(beta.ppf(1 - alpha, k + 1, n - k))


def _rates_bound(fp: int, n_out: int, fn: int, n_in: int, delta: float, alpha: float) -> float:
  """epsilon >= the larger of log((1 - delta - FNR) / FPR) and log((1 - delta - FPR) / FNR)
  at the rates' Clopper-Pearson upper bounds, each at level 1 - alpha / 2; 0 where
  neither is positive."""
  fpr = clopper_pearson_upper(fp, n_out, alpha / 2)
  fnr = clopper_pearson_upper(fn, n_in, alpha / 2)
  best = 0.0
  for hit, miss in ((1 - delta - fnr, fpr), (1 - delta - fpr, fnr)):
    if hit > 0 and miss > 0:
      best = max(best, math.log(hit / miss))
  return best


def threshold_bound(inserted: np.ndarray, absent: np.ndarray, delta: float,
                    confidence: float = 0.95, seed: int = 0) -> dict:
  """A lower bound on epsilon that holds with probability `confidence`, from one
  statistic per run: runs with the canary (`inserted`) and without (`absent`).

  The test "statistic > t means the canary was there" has false-positive rate FPR
  and false-negative rate FNR; an (epsilon, delta)-DP release forces
  1 - FNR <= e^epsilon FPR + delta and 1 - FPR <= e^epsilon FNR + delta. Each
  set is split in halves at random (seeded): t is the threshold that gives the
  largest bound on the first halves, and the bound is computed on the second
  halves alone, with Clopper-Pearson upper bounds on both rates (a union bound
  over the two), so choosing t costs no validity (Jagielski et al. 2020's
  audit with a held-out threshold)."""
  inserted, absent = np.asarray(inserted, np.float64), np.asarray(absent, np.float64)
  if not (np.all(np.isfinite(inserted)) and np.all(np.isfinite(absent))):
    raise ValueError("a multi-run bound needs finite statistics (a NaN is on neither side of "
                     "any threshold)")
  if min(len(inserted), len(absent)) < MIN_CANARIES:
    raise ValueError(f"a multi-run bound needs at least {MIN_CANARIES} runs with and without "
                     f"the canary; got {len(inserted)} and {len(absent)}")
  alpha = 1 - confidence
  rng = np.random.default_rng(seed)
  a, b = rng.permutation(inserted), rng.permutation(absent)
  fit_in, test_in = a[:len(a) // 2], a[len(a) // 2:]
  fit_out, test_out = b[:len(b) // 2], b[len(b) // 2:]

  def bound(t, ins, outs):
    return _rates_bound(int(np.sum(outs > t)), len(outs), int(np.sum(ins <= t)), len(ins),
                        delta, alpha)
  candidates = np.unique(np.concatenate([fit_in, fit_out]))   # ties: one test each
  t = max(candidates, key=lambda c: bound(c, fit_in, fit_out))
  return {"epsilon_lower_bound": bound(t, test_in, test_out), "confidence": confidence,
          "threshold": float(t), "runs_fit": [len(fit_in), len(fit_out)],
          "runs_tested": [len(test_in), len(test_out)],
          "false_positives": int(np.sum(test_out > t)),
          "false_negatives": int(np.sum(test_in <= t)),
          # with no error at all: what these many runs can show at most
          "largest_possible_bound": _rates_bound(0, len(test_out), 0, len(test_in), delta,
                                                 alpha)}


# ------------------------------------------------------- the one-run lower bounds

LOW_FPRS = (0.01, 0.1)      # the TPRs reported: an attack's worth shows at low FPR
ONE_RUN_ASSUMES = (
    "each canary's inclusion a fair coin independent of the rest (Steinke et al. 2023); "
    "here a uniformly random half of the canaries' exchangeable directions is inserted "
    "(as many inserted as held out), whose counts concentrate more than independent "
    "coins' (simulated: fewer false bounds, 0.7 to 2.2 % of trials at 95 % where "
    "independent coins gave 1.1 to 4.4 %)")
FDP_IS = (
    "the epsilon at delta of the Gaussian trade-off curve the scores rule out (Mahloujifar et "
    "al. 2024): a lower bound on epsilon only where the release is one Gaussian mechanism "
    "(every client in every round, or a fixed schedule, no subsampling); otherwise the "
    "Gaussian-DP equivalent, not a bound on the accounted epsilon")


def one_run_bounds(inserted: np.ndarray, held_out: np.ndarray, delta: float,
                   confidence: float = 0.95, gaussian_release: bool = False) -> dict:
  """Lower bounds on epsilon from one training run's canary scores (higher for an
  inserted canary), each holding with probability `confidence`: Steinke, Nasr and
  Jagielski 2023 ("Privacy auditing with one (1) training run": the correct guesses
  among those made at a threshold, against the binomial an (epsilon, delta) release
  allows) and its f-DP refinement (Mahloujifar et al. 2024), each threshold's figure
  by jax-privacy's CanaryScoreAuditor. The thresholds tried are fixed shares of the
  highest scores (guess_thresholds), each at level (1 - confidence) / their count.
  Also the largest bound these many canaries could show (every guess right: it
  falls as canaries x delta grows, Steinke et al.'s delta term), the attack's AUROC
  and its TPR at low FPR.

  The bounds are given only where as many canaries are held out as inserted (a
  prior of one half; ONE_RUN_ASSUMES); the f-DP figure is a bound only for a release
  that is one Gaussian mechanism (`gaussian_release`; FDP_IS)."""
  inserted, held_out = np.asarray(inserted, np.float64), np.asarray(held_out, np.float64)
  if not (np.all(np.isfinite(inserted)) and np.all(np.isfinite(held_out))):
    raise ValueError("one-run bounds need finite scores (a NaN or an infinity is on neither "
                     "side of every threshold)")
  if not 0 < confidence < 1:
    raise ValueError(f"confidence {confidence}: a probability in (0, 1)")
  out = {"confidence": confidence, "delta": delta, **attack_rates(inserted, held_out)}
  if len(inserted) != len(held_out):
    return {**out, "epsilon_one_run": None, "epsilon_one_run_fdp": None,
            "why_none": (f"{len(inserted)} canaries inserted and {len(held_out)} held out: the "
                         "one-run bound needs a prior of one half (as many of each)")}
  thresholds = guess_thresholds(np.concatenate([inserted, held_out]))
  alpha = (1 - confidence) / len(thresholds)
  best = lambda ins, out, fdp: _best_over_thresholds(ins, out, thresholds, alpha, delta, fdp)
  # every guess right: all inserted above all held out, guessed at once
  return {**out, "epsilon_one_run": best(inserted, held_out, False),
          "epsilon_one_run_fdp": best(inserted, held_out, True),
          "largest_possible_bound": _best_over_thresholds(
              np.ones_like(inserted), np.zeros_like(held_out), np.array([1.0]), alpha, delta,
              False),
          "thresholds_tried": int(len(thresholds)), "assumes": ONE_RUN_ASSUMES,
          "fdp_is": FDP_IS, "fdp_is_a_bound_here": bool(gaussian_release)}


GUESS_SHARES = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)


def guess_thresholds(scores: np.ndarray) -> np.ndarray:
  """The thresholds tried: the k-th highest score for k a fixed share of all the
  canaries (GUESS_SHARES; Steinke et al. guess 'in' for the k highest scores). The
  set depends on the scores alone, never on which canaries were inserted, so a
  Bonferroni correction over it keeps the bound's level (jax-privacy's own picks the
  ROC hull's corners after seeing the labels, which an audit measured a little above
  its level)."""
  ordered = np.sort(np.asarray(scores, np.float64))[::-1]
  ks = sorted({min(len(ordered), max(1, int(math.ceil(f * len(ordered))))) for f in GUESS_SHARES})
  return np.unique(ordered[np.asarray(ks) - 1])


def _best_over_thresholds(inserted, held_out, thresholds, alpha: float, delta: float,
                          fdp: bool) -> float:
  """The largest one-run (or f-DP) bound over `thresholds` ('in' for a score >= t),
  each at level alpha, by jax-privacy's CanaryScoreAuditor at that threshold. A
  threshold whose guesses are no better than a coin (precision <= 1/2) bounds
  nothing and is skipped."""
  from jax_privacy import auditing
  auditor = auditing.CanaryScoreAuditor(inserted, held_out)
  method = auditor.epsilon_one_run_fdp if fdp else auditor.epsilon_one_run
  best = 0.0
  for t in thresholds:
    right = int(np.sum(inserted >= t))
    guessed = right + int(np.sum(held_out >= t))
    if guessed == 0 or right * 2 <= guessed:
      continue
    best = max(best, float(method(alpha, delta, threshold_strategy=auditing.Explicit(float(t)))))
  return best


def attack_rates(inserted: np.ndarray, held_out: np.ndarray) -> dict:
  """The threshold attack's AUROC (Mann-Whitney: the chance an inserted canary scores
  above a held-out one, ties counting half), and the TPR at each of LOW_FPRS of the
  ROC's convex hull (jax-privacy's auditor, randomising between two thresholds; on
  the same scores it is chosen on, so optimistic), each only at an FPR the held-out
  canaries can resolve (at least 1 / their count)."""
  from jax_privacy import auditing
  from scipy.stats import mannwhitneyu
  inserted, held_out = np.asarray(inserted, np.float64), np.asarray(held_out, np.float64)
  auditor = auditing.CanaryScoreAuditor(inserted, held_out)
  auroc = float(mannwhitneyu(inserted, held_out).statistic) / (len(inserted) * len(held_out))
  return {"auroc": auroc,
          "tpr_at_fpr": {str(f): (float(auditor.tpr_at_given_fpr(f))
                                  if f * len(held_out) >= 1 else None) for f in LOW_FPRS},
          "tpr_is": "the ROC convex hull's on the same scores (optimistic); null where the "
                    "held-out canaries are too few to resolve that FPR"}
