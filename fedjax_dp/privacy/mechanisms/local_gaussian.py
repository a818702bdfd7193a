"""Local DP's Gaussian mechanism: each client clips its update to C and adds
N(0, (z C)^2) per coordinate (times its per-cluster factor) before the report
leaves (`client`: at the client's trust boundary); the server averages the
reports over the participants.

One participation releases the client's whole report (no amplification by
sampling): replace one client, sensitivity 2 C, so a Gaussian of multiplier z / 2
per participation. Each client keeps its own ledger; with target_epsilon (or
per-client budgets) a client whose ledger would pass its budget is refused.
Per-cluster noise (a rule whose state sets each client's factor, `client_noise`:
the cluster rule with cluster_noise 'equalize') is charged per client.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.privacy import accounting, clip_layout, noise_control
from fedjax_dp.privacy.mechanisms.base import (Admission, CohortSampling, Mechanism, Plan,
                                               clip, planned_scales)


def plan(setup, state, hp) -> Plan:
  """This round's noise scales and one participation's RDP: the static event, or
  under a noise schedule that of the scheduled noise."""
  scales, event = planned_scales(setup, state, hp), hp.get("event_rdp")
  if setup.privacy.schedule != "static":
    event = noise_control.local_event_rdp(hp["update_noise"], setup.privacy.layout.fractions,
                                          scales)
  return Plan(scales, event, jnp.int32(0))


def admit(setup, state, ids, mask, plan: Plan, hp) -> Admission:
  """The per-cluster noise factors and each client's own budget: a client takes
  part only if its ledger stays within its budget after the participation."""
  factor = jnp.ones((setup.num_clients,), jnp.float32)
  client_event = plan.event
  if setup.client_noise is not None:   # the rule's state sets each client's factor
    factor = setup.client_noise(state.server_state["aggregator"])
    # RDP of a Gaussian goes as 1 / z^2; nudged up past the float32 rounding
    client_event = (plan.event[None, :] / jnp.square(factor[ids])[:, None]) * (1.0 + 1e-6)
  spent = jnp.zeros((), jnp.int32)
  if setup.privacy.target_epsilon is not None:
    after = accounting.compose(state.privacy.ledger[ids], client_event)
    within = accounting.epsilon(after, hp["delta"])[0] <= hp["client_budget_limits"][ids]
    spent = jnp.sum(mask & ~within, dtype=jnp.int32)
    mask = mask & within
  skip = jnp.zeros((), bool)
  return Admission(mask, skip, spent + skip.astype(jnp.int32), factor, client_event)


def client(setup, delta, cid, key, clip_norm, client_hp, scales, factor):
  """One client's report: its update clipped by the layout, then noised from its own
  stream fold_in(fold_in(key, tag), cid) with std z C factor (per part: scales)."""
  delta, norm = clip(setup, delta, clip_norm)
  delta = clip_layout.add_one_client_noise(
      delta, cid, jax.random.fold_in(key, setup.local_noise_tag),
      client_hp["update_noise"] * clip_norm, setup.privacy.layout, scales, factor)
  return delta, norm


def report_noise_std(setup, tree, clip_norm, client_hp, scales) -> list:
  """Each leaf's std of one report's noise before its client's factor, z C (per
  part: scales): what `client` draws, for the round that draws the sum of the
  cohort's reports' noise at once (core/client_phase.py)."""
  return clip_layout.noise_std_per_leaf(setup.privacy.layout, client_hp["update_noise"]
                                        * clip_norm, tree, scales)


def release(setup, delta, state, plan: Plan, adm, ids, participants, unclipped, key,
            clip_norm, hp):
  """The mean of the reports as it is; each participant's ledger composes its event."""
  # only real slots write: padded slots carry client id 0, and a second write to
  # client 0's row (its old ledger) could win over its update (found with 4 devices)
  ledger = state.privacy.ledger
  ledger = ledger.at[jnp.where(adm.mask, ids, setup.num_clients)].set(
      accounting.compose(ledger[ids], adm.client_event, adm.mask), mode="drop")
  event = jnp.where(participants > 0, 0 if setup.privacy.schedule == "static" else -2, -1)
  return delta, state.privacy._replace(ledger=ledger, clip_norm=clip_norm), jnp.asarray(
      event, jnp.int32)


def event_rdp(z: float, cohort: CohortSampling | None = None) -> np.ndarray:
  """RDP of one participation at multiplier z: the whole report, replace one
  (multiplier z / 2); infinite without noise."""
  if z == 0:
    return np.full(len(accounting.DEFAULT_ORDERS), np.inf)
  return accounting.gaussian_rdp(z / 2)


def describe(cohort: CohortSampling | None = None) -> dict[str, str]:
  """The privacy report's lines for this mechanism."""
  return {"mechanism": ("local DP: each client clips its update to L2 norm clip_norm and adds "
                        "N(0, (noise_multiplier * clip_norm)^2) from its own key before "
                        "sending; the server averages the participants' reports"),
          "guarantee": ("per client: its epsilon below covers everything it sent (replace-one "
                        "neighbours of its data, sensitivity 2 clip_norm), against the server "
                        "and anyone who sees the reports; no amplification by sampling is "
                        "claimed"),
          "neighbouring": "replace one client's data (sensitivity 2 clip_norm)"}


def local_gaussian() -> Mechanism:
  return Mechanism("local", plan=plan, admit=admit, release=release, client=client,
                   report_noise=report_noise_std,
                   event_rdp=event_rdp, describe=describe, noises_each_upload=True, per_client_ledgers=True,
                   scales_client_noise=True,
                   boundary="client", divides_by="participants",
                   client_hparams=("update_noise",), accountants=("rdp", "pld"),
                   recipe_prefix="ldp_")
