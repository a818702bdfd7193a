"""Central DP's Gaussian mechanism (DP-FedAvg, McMahan et al. 2018).

The trusted server clips each upload it receives to C (`clip`: at the server's
trust boundary, after whatever the client sent), adds N(0, (z C)^2) per
coordinate to the sum (per clip part, scaled by the noise planner), and divides
by the expected cohort size clients_per_round (a fixed denominator: the realised
size is itself private). One round is a subsampled Gaussian:

  sampling 'poisson'  add/remove one client, sensitivity C, multiplier z;
  sampling 'fixed'    exactly clients_per_round of num_clients without
                      replacement, replace one client, sensitivity 2 C, so
                      multiplier z / 2 (Wang, Balle, Kasiviswanathan 2019).

With target_epsilon the noise is calibrated to reach it in `rounds`; a round
that would pass it (tiers, a noise schedule) is skipped. Adaptive clipping
(Andrew et al. 2021) releases the clipped count here too.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.kernels import gaussian_noise
from fedjax_dp.privacy import accounting, clip_layout
from fedjax_dp.privacy.mechanisms.base import (SCORE_GRID, Admission, CohortSampling, Mechanism,
                                               Plan, clip, planned_scales, poisson_rate_used)


def plan(setup, state, hp) -> Plan:
  """This round's noise scales and RDP: the static event, or under a noise
  schedule the tabulated RDP at the controller's score (rounded up, so the charge
  is never below the noise used: the noise falls as the score grows)."""
  scales, event, index = planned_scales(setup, state, hp), hp.get("event_rdp"), jnp.int32(0)
  if setup.privacy.schedule != "static":
    score = state.server_state["noise_control"]["score"]
    k = jnp.ceil(score * (SCORE_GRID - 1) - 1e-6).astype(jnp.int32)
    index = jnp.clip(k, 0, SCORE_GRID - 1)
    event = hp["event_table"][index] * (1.0 + 1e-6)
  return Plan(scales, event, index)


def admit(setup, state, ids, mask, plan: Plan, hp):
  """Every drawn client; with target_epsilon checked in the round (stop_in_round), a
  round that would pass it is not run (nothing released)."""
  skip = jnp.zeros((), bool)
  if setup.privacy.stop_in_round:
    skip = accounting.epsilon(accounting.compose(state.privacy.ledger, plan.event),
                              hp["delta"])[0] > hp["budget_limit"]
    mask = mask & ~skip
  return Admission(mask, skip, jnp.zeros((), jnp.int32) + skip.astype(jnp.int32),
                   jnp.ones((setup.num_clients,), jnp.float32), plan.event)


def client(setup, delta, cid, key, clip_norm, client_hp, scales, factor):
  """The server's clip of one received upload (no noise: that is on the sum)."""
  return clip(setup, delta, clip_norm)


def release(setup, delta, state, plan: Plan, adm, ids, participants, unclipped, key,
            clip_norm, hp):
  """N(0, (z C)^2) per coordinate on the sum, divided by the expected cohort; the
  ledger composes the round unless it was skipped; adaptive clipping's next norm.
  The noise is released even when nobody took part."""
  privacy, expected_cohort = setup.privacy, setup.expected_cohort
  std = hp["update_noise"] * clip_norm
  delta = jax.tree.map(
      lambda d: d / expected_cohort,
      gaussian_noise.add_gaussian_noise(delta, jax.random.fold_in(key, setup.noise_tag),
                                        clip_layout.noise_std_per_leaf(privacy.layout, std,
                                                                       delta, plan.scales)))
  ledger = state.privacy.ledger
  ledger = jnp.where(adm.skip, ledger, accounting.compose(ledger, plan.event))
  if privacy.adaptive:
    clip_norm = clip_layout.adaptive_clip_norm(
        clip_norm, unclipped - 0.5 * participants, jax.random.fold_in(key, setup.count_tag),
        expected_cohort, hp["target_quantile"], hp["clip_lr"], hp["count_stddev"])
  event = jnp.where(adm.skip, -1, plan.event_index)
  return delta, state.privacy._replace(ledger=ledger, clip_norm=clip_norm), jnp.asarray(
      event, jnp.int32)


def event_rdp(z: float, cohort: CohortSampling) -> np.ndarray:
  """RDP of one round at accounted multiplier z (module docstring); infinite
  without noise."""
  return _event_rdp(cohort.sampling, cohort.clients_per_round, cohort.num_clients,
                    float(z)).copy()


@functools.lru_cache(maxsize=4096)
def _event_rdp(sampling: str, per_round: int, num_clients: int, z: float) -> np.ndarray:
  """event_rdp by the values it depends on (cached: a calibration and a noise
  schedule's table each evaluate dozens of curves, at 0.1-0.2 s each)."""
  if z == 0:
    return np.full(len(accounting.DEFAULT_ORDERS), np.inf)
  if sampling == "fixed":
    return accounting.fixed_size_gaussian_rdp(per_round, num_clients, z / 2)
  return accounting.poisson_gaussian_rdp(poisson_rate_used(per_round / num_clients), z)


def describe(cohort: CohortSampling) -> dict[str, str]:
  """The privacy report's lines for this mechanism."""
  neighbouring = ("replace one client (fixed-size cohorts; sensitivity 2 clip_norm)"
                  if cohort.sampling == "fixed" else
                  "add/remove one client (Poisson sampling; sensitivity clip_norm)")
  return {"mechanism": ("DP-FedAvg (user level): each client's update clipped to L2 norm "
                        "clip_norm, N(0, (noise_multiplier * clip_norm)^2) added to the sum, "
                        "divided by the expected cohort size clients_per_round"),
          "guarantee": f"the accountant's epsilon below, for {neighbouring} neighbours",
          "neighbouring": neighbouring}


def central_gaussian() -> Mechanism:
  return Mechanism("central", plan=plan, admit=admit, release=release, client=client,
                   event_rdp=event_rdp, describe=describe, noises_sum=True,
                   calibrates_to_target=True, boundary="server", divides_by="expected_cohort",
                   releases_every_round=True, accountants=("rdp", "pld"), recipe_prefix="dp_",
                   needs_random_cohorts=True)
