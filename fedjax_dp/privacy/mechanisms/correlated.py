"""Correlated noise across rounds (DP-FTRL, the matrix mechanism): the round half
that the tree, BandMF and BLT mechanisms share (privacy/mechanisms/tree.py,
bandmf.py, blt.py each build a `Strategy` and a Mechanism from it here).

The trusted server clips each upload it receives to C (at its trust boundary, as
central DP does) and sums them: G_t, the round's sum. The matrix mechanism
releases C_s G + Z for a lower-triangular n x n strategy C_s and
Z ~ N(0, (z sens C)^2) per row and coordinate, sens = the largest norm of
C_s's columns summed over a client's participations (the run's participation
schema: min_sep, max_participations, placement/participation.py); the model
follows the decoded sums C_s^{-1} (C_s G + Z) = G + C_s^{-1} Z. Round t so adds

    noise_t = z sens C (C_s^{-1} xi)_t,   xi_t ~ N(0, I) drawn from round t's key

to the sum, streamed: the strategy's inverse (jax-privacy's StreamingMatrix) keeps
a few model-sized buffers in the mechanism's state slot (`CorrelatedState.noise`),
checkpointed with the round state and vmapped with a sweep's replicas (each
replica's round keys are its own). The sum is then divided by the expected cohort.

Privacy: zero-out neighbours (one client's clipped updates replaced by zero; who
takes part when is the sampler's public schedule), C_s G has sensitivity sens C, so
the whole run is one Gaussian mechanism of multiplier z: RDP alpha / (2 z^2).
The ledger charges it in pieces, `Strategy.charges[t]` of it in round t, each piece
the growth of the sensitivity of the rounds released so far (an upper bound on
it, exact at the last round), so an epsilon read mid-run covers what was
released and the run's last epsilon is exactly the Gaussian's.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.kernels import gaussian_noise
from fedjax_dp.privacy import accounting, clip_layout
from fedjax_dp.privacy.mechanisms import central_gaussian
from fedjax_dp.privacy.mechanisms.base import (Mechanism, Plan, everyone, planned_scales,
                                               poisson_rate_used)


class Strategy(NamedTuple):
  """A correlated-noise strategy built for one run (its rounds and participation)."""
  name: str
  inverse: Any               # StreamingMatrix (jax-privacy's protocol): init_multiply(params
                             # shapes) -> state; multiply_next(xi, state) -> ((C_s^-1 xi)_t, state)
  sensitivity2: float        # sens^2: C_s's column norms^2 summed over a client's participations,
                             # the worst client under the run's schema (whole run)
  charges: np.ndarray        # float64 [rounds]: the share of the run's RDP charged in each round
                             # (>= 0, summing to 1)
  says: str                  # the report's line for it
  round_rms: float | None = None   # sqrt(mean_t ||(C_s^{-1})_t||^2): a round's noise std
                                   # over Z's (None: not computed, error_factors)
  prefix_rms: float | None = None  # sqrt(mean_t ||(A C_s^{-1})_t||^2), A the prefix sums: the
                                   # RMS error of the noisy prefix sums (the model's), over Z's
  sampled: float | None = None   # amplified (BandMF under cyclic_poisson): the rate q a client
                                 # is drawn with in its group's rounds; each of its
                                 # participations is then a Poisson-subsampled Gaussian,
                                 # sensitivity2 one participation's, charged as its cycle starts

  def noise_std(self, z, clip_norm):
    """The std of Z's rows: z sens C."""
    return z * clip_norm * float(np.sqrt(self.sensitivity2))


MAX_ERROR_ROUNDS = 4096    # error_factors materialises rounds^2 floats


def error_factors(inverse, rounds: int) -> tuple[float | None, float | None]:
  """(round_rms, prefix_rms) of the streamed C^{-1} over `rounds` rounds, materialised
  by streaming the identity through it; (None, None) past MAX_ERROR_ROUNDS."""
  if rounds > MAX_ERROR_ROUNDS:
    return None, None
  m = np.asarray(inverse.materialize(rounds), np.float64)    # [rounds, rounds] C^{-1}
  rms = lambda a: float(np.sqrt(np.mean(np.sum(np.square(a), axis=1))))
  return rms(m), rms(np.cumsum(m, axis=0))


class CorrelatedState(NamedTuple):
  """The mechanism's state slot: PrivacyState's two fields, then the noise's."""
  ledger: jax.Array          # float32 [orders]: RDP charged so far
  clip_norm: jax.Array       # float32: the clip norm
  noise: Any                 # the strategy inverse's streaming state (model-shaped buffers)


def charges_from_prefixes(rounds: int, points, sens2) -> np.ndarray:
  """float64 [rounds]: the shares charged when the sensitivity^2 of the first
  points[i] rounds is at most sens2[i] (points increasing, the last = rounds): the
  round that opens a stretch charges the stretch's growth, so after any round the
  ledger holds the next point's sensitivity, never less than the released rounds'."""
  points, sens2 = np.asarray(points, np.int64), np.asarray(sens2, np.float64)
  if points[-1] != rounds or np.any(np.diff(points) <= 0) or np.any(np.diff(sens2) < 0):
    raise ValueError(f"prefix points {points.tolist()} must rise to rounds {rounds}, with "
                     "sensitivities that do not fall")
  out = np.zeros(rounds, np.float64)
  starts = np.concatenate([[0], points[:-1]])
  out[starts] = np.diff(np.concatenate([[0.0], sens2])) / sens2[-1]
  return out


def _plan(strategy: Strategy, setup, state, hp) -> Plan:
  """This round's share of the run's Gaussian RDP (zero where no charge falls), and
  the noise's scale per clip part (1; the audit's test mode lowers it)."""
  charges = jnp.asarray(strategy.charges, jnp.float32)
  share = charges[jnp.minimum(state.round, charges.shape[0] - 1)]
  return Plan(planned_scales(setup, state, hp), hp["event_rdp"] * share, jnp.int32(0))


def _release(strategy: Strategy, setup, delta, state, plan: Plan, adm, ids, participants,
             unclipped, key, clip_norm, hp):
  """The sum plus z sens C (C_s^{-1} xi)_t, divided by the expected cohort; the
  ledger composes the round's share (released every round, taken part or not)."""
  xi = gaussian_noise.gaussian_noise(delta, jax.random.fold_in(key, setup.noise_tag), 1.0)
  noise, stream = strategy.inverse.multiply_next(xi, state.privacy.noise)
  stds = clip_layout.noise_std_per_leaf(setup.privacy.layout,
                                        strategy.noise_std(hp["update_noise"], clip_norm), delta,
                                        plan.scales)
  leaves, treedef = jax.tree.flatten(delta)
  delta = jax.tree.unflatten(treedef, [
      (d + s * w.astype(d.dtype)) / setup.expected_cohort
      for d, s, w in zip(leaves, stds, jax.tree.leaves(noise))])
  ledger = accounting.compose(state.privacy.ledger, plan.event)
  next_clip = state.privacy.clip_norm
  if setup.privacy.adaptive:   # the released count moves next round's clip
    next_clip = clip_layout.adaptive_clip_norm(
        clip_norm, unclipped - 0.5 * participants, jax.random.fold_in(key, setup.count_tag),
        setup.expected_cohort, hp["target_quantile"], hp["clip_lr"], hp["count_stddev"])
  return delta, CorrelatedState(ledger, next_clip, stream), jnp.int32(0)


def _init_state(num_clients: int, clip_norm: float, params, privacy) -> CorrelatedState:
  """Round 0's slot: an empty ledger, the clip norm, the strategy's empty buffers
  (shaped like the model, float32)."""
  shapes = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, jnp.float32), params)
  return CorrelatedState(accounting.init_ledger(), jnp.float32(clip_norm),
                         privacy.strategy.inverse.init_multiply(shapes))


def count_queries(strategy: Strategy, participation) -> int:
  """k_c: the count queries of adaptive clipping (Andrew et al. 2021) the accountant
  composes with the strategy's Gaussian, for one client: one per participation
  (std count_stddev; zero-out neighbours zero a client's contribution to every query,
  its centred bit b - 1/2 included, so the count's sensitivity is 1/2, multiplier 2
  s, as central DP's under add/remove); amplified, each rides in its participation's
  subsampled Gaussian with the strategy's column (the same draw decides both), so 1
  there."""
  return 1 if strategy.sampled is not None else participation.max_participations


def update_noise_multiplier(z: float, count_stddev: float, count_queries_: int) -> float:
  """z_u, the updates' multiplier, so that the strategy's Gaussian and `count_queries_`
  count queries (multiplier 2 s each) compose to one Gaussian of multiplier z:
  1/z^2 = 1/z_u^2 + k_c/(2 s)^2."""
  rest = z ** -2 - count_queries_ / (2.0 * count_stddev) ** 2
  if rest <= 0:
    raise ValueError(f"adaptive clipping beside correlated noise needs the count's std > z "
                     f"sqrt(k) / 2 = {z * count_queries_ ** 0.5 / 2:g} ({count_queries_} "
                     f"count quer{'ies' if count_queries_ > 1 else 'y'} of a client composed with "
                     f"the strategy's Gaussian of multiplier z = {z:g})")
  return rest ** -0.5


def with_count_charges(strategy: Strategy, participation, rounds: int) -> Strategy:
  """The strategy with charges that also cover adaptive clipping's count queries
  after every round: the cumulative larger of its own shares and one participation
  per cycle of min_sep rounds (1 / k as each begins), so that every prefix of the
  ledger covers both whatever their weights, and the whole run is charged once."""
  k, b = participation.max_participations, participation.min_sep
  cycles = charges_from_prefixes(rounds, [min(rounds, (j + 1) * b) for j in range(k)],
                                 np.arange(1.0, k + 1))
  covered = np.maximum(np.cumsum(strategy.charges), np.cumsum(cycles))
  return strategy._replace(charges=np.diff(np.concatenate([[0.0], covered])))


def charged_steps(z: float, strategy: Strategy, rounds: int) -> tuple[float, float, int]:
  """(q, multiplier, steps): what the ledger holds after `rounds` rounds as `steps`
  Poisson-subsampled Gaussians of rate q (privacy/planning.pld_epsilon's
  arguments), for the PLD figure of the report and the plan. Unamplified, one
  Gaussian: the ledger holds share x alpha / (2 z^2), multiplier z / sqrt(share) (z
  after the last round), q = 1; amplified, the cycles charged so far at z."""
  charged = np.asarray(strategy.charges[:rounds])
  if strategy.sampled is not None:
    return strategy.sampled, z, int(np.count_nonzero(charged))
  share = float(np.sum(charged))
  return 1.0, (z / float(np.sqrt(share)) if share > 0 else float("inf")), 1


def amplified(cohort) -> tuple[float, int] | None:
  """(q, participations) where the sampler amplifies (cyclic_poisson: Poisson inside
  each group's rounds; Choquette-Choo et al. 2023, as jax-privacy's
  amplified_bandmf_event accounts it), else None. q: the rate the sampler really
  draws with (jax.random.bernoulli's float32 grid)."""
  schema = getattr(cohort, "participation", cohort)   # a CohortSampling or the schema
  if schema is None or schema.sampling != "cyclic_poisson":
    return None
  return poisson_rate_used(schema.sampling_prob), schema.max_participations


def event_rdp_with(amplifies: bool) -> Callable:
  def event_rdp(z: float, cohort) -> np.ndarray:
    """RDP of the whole run at multiplier z: one Gaussian of sensitivity 1 (the
    strategy's sensitivity is in the noise's std), or amplified its participations'
    Poisson-subsampled Gaussians; infinite without noise."""
    if z == 0:
      return np.full(len(accounting.DEFAULT_ORDERS), np.inf)
    sampled = amplified(cohort) if amplifies else None
    if sampled is not None:
      q, k = sampled
      return k * accounting.poisson_gaussian_rdp(q, float(z))
    return accounting.gaussian_rdp(float(z))
  return event_rdp


def describe_with(what: str, amplifies: bool) -> Callable:
  def describe(cohort) -> dict[str, str]:
    if amplifies and amplified(cohort) is not None:
      neighbouring = ("zero-out one client (its contributions, clipped updates and adaptive "
                      "clipping's centred count bits, replaced by zero; its group is "
                      "public, whether it is drawn in its group's rounds is not): sensitivity "
                      "clip_norm per participation, through one column of the strategy")
      how = "amplified by the Poisson draw inside each group's rounds"
    else:
      neighbouring = ("zero-out one client (its contributions, clipped updates and adaptive "
                      "clipping's centred count bits, replaced by zero; the "
                      "participation schedule is public): sensitivity clip_norm per "
                      "participation, summed through the strategy")
      how = "with no amplification by sampling"
    return {"mechanism": what, "guarantee": f"the accountant's epsilon below, for {neighbouring} "
                                            f"neighbours, {how}",
            "neighbouring": neighbouring}
  return describe


def mechanism(name: str, strategy_for: Callable, what: str, reads: tuple = (),
              check: Callable | None = None, amplifies: bool = False) -> Mechanism:
  """A correlated-noise mechanism: `strategy_for(settings, participation, rounds)`
  builds its Strategy at set-up (privacy/setup.Privacy.strategy); the round's
  functions read it from there. `amplifies`: its strategy is banded within the
  sampler's separation, so cyclic_poisson's draws amplify it (BandMF)."""
  def plan(setup, state, hp):
    return _plan(setup.privacy.strategy, setup, state, hp)

  def release(setup, delta, state, plan_, adm, ids, participants, unclipped, key, clip_norm, hp):
    return _release(setup.privacy.strategy, setup, delta, state, plan_, adm, ids, participants,
                    unclipped, key, clip_norm, hp)

  # every drawn client takes part; the server clips each upload it receives, as central
  # DP's (the noise is on the sum)
  return Mechanism(name, plan=plan, admit=everyone, release=release,
                   client=central_gaussian.client,
                   event_rdp=event_rdp_with(amplifies), describe=describe_with(what, amplifies),
                   noises_sum=True,
                   calibrates_to_target=True, boundary="server", divides_by="expected_cohort",
                   releases_every_round=True, accountants=("rdp", "pld"), recipe_prefix="dp_",
                   strategy_for=strategy_for, init_state=_init_state, reads=reads,
                   check=check, charged_once=True)
