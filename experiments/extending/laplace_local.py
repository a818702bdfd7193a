"""A privacy mechanism in one file: local DP with the Laplace mechanism.

Each client clips its update to L1 norm C (clip_norm) and adds Laplace noise of
scale b = z C (z: noise_multiplier) to every coordinate before the report leaves
(the client's trust boundary); the server averages the reports. Two neighbouring
datasets differ in one client's data (replace one), so one report's L1
sensitivity is 2 C and a participation is (2 / z)-DP; as RDP at order a, with
eps0 = 2 / z (Mironov 2017, Proposition 6),

  eps(a) = 1 / (a - 1) log( a / (2a - 1) exp((a - 1) eps0) + (a - 1) / (2a - 1) exp(-a eps0) ).

Each client keeps its own ledger (per_client_ledgers), as local DP's Gaussian
does, so target_epsilon caps each client's participations. Run it with

  fedjax-dp run --config experiments/demo.yaml --out runs/laplace_local \\
      --set plugins=[experiments/extending/laplace_local.py] dp=laplace_local \\
      noise_multiplier=8 clip_norm=0.5 hidden=[16] server_lr=0.05 rounds=20

(README: Extending; tests/test_extension.py checks it against dp-accounting and
attacks it.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from fedjax_dp.privacy import accounting
from fedjax_dp.privacy.mechanisms import Mechanism, Plan, register_mechanism
from fedjax_dp.privacy.mechanisms import local_gaussian


def laplace_rdp(eps0: float, orders=accounting.DEFAULT_ORDERS) -> np.ndarray:
  """RDP of the Laplace mechanism whose pure-DP epsilon is eps0, at each order (> 1)."""
  a = np.asarray(orders, np.float64)
  # the log of the sum of the two exponentials, without overflow at high orders
  return np.logaddexp(np.log(a / (2 * a - 1)) + (a - 1) * eps0,
                      np.log((a - 1) / (2 * a - 1)) - a * eps0) / (a - 1)


def event_rdp(z: float, cohort=None) -> np.ndarray:
  """One participation at multiplier z: L1 sensitivity 2 C, scale z C: eps0 = 2 / z."""
  if z == 0:
    return np.full(len(accounting.DEFAULT_ORDERS), np.inf)
  return laplace_rdp(2.0 / z)


def plan(setup, state, hp) -> Plan:
  """No noise schedule (check refuses one): scale 1 and the static event."""
  return Plan(jnp.ones((1,), jnp.float32), hp["event_rdp"], jnp.int32(0))


def client(setup, delta, cid, key, clip_norm, client_hp, scales, factor):
  """One client's report: its update scaled to L1 norm <= C, plus Laplace(z C) per
  coordinate from its own stream. Returns (report, the L1 norm before the clip)."""
  flat, unravel = ravel_pytree(delta)
  norm = jnp.sum(jnp.abs(flat))
  finite = jnp.isfinite(norm)   # a NaN or inf update is sent as zero
  clipped = jnp.where(finite, flat * jnp.minimum(1.0, clip_norm / jnp.maximum(norm, 1e-30)), 0.0)
  own = jax.random.fold_in(jax.random.fold_in(key, setup.local_noise_tag), cid)
  scale = client_hp["update_noise"] * clip_norm
  return unravel(clipped + scale * jax.random.laplace(own, flat.shape, jnp.float32)), norm


def check(settings: dict) -> str | None:
  """What this mechanism cannot run: what it would otherwise ignore."""
  for key, plain in (("noise_schedule", "static"), ("clip_parts", "flat"),
                     ("cluster_noise", "uniform"), ("client_budgets", "uniform")):
    if settings.get(key, plain) != plain:
      return (f"config key {key!r} = {settings[key]!r} with dp 'laplace_local': this "
              f"mechanism supports only {plain!r}")
  return None


def describe(cohort=None) -> dict[str, str]:
  """The privacy report's lines for this mechanism."""
  return {"mechanism": ("local DP, Laplace: each client clips its update to L1 norm clip_norm "
                        "and adds Laplace(noise_multiplier * clip_norm) per coordinate from its "
                        "own key before sending; the server averages the participants' reports"),
          "guarantee": ("per client: its epsilon below covers everything it sent (replace-one "
                        "neighbours of its data, L1 sensitivity 2 clip_norm: 2 / "
                        "noise_multiplier per participation, as pure DP), against the server "
                        "and anyone who sees the reports; no amplification by sampling is "
                        "claimed"),
          "neighbouring": "replace one client's data (L1 sensitivity 2 clip_norm)"}


register_mechanism(Mechanism(
    "laplace_local", plan=plan, admit=local_gaussian.admit, release=local_gaussian.release,
    client=client, event_rdp=event_rdp, check=check, describe=describe, noises_each_upload=True,
    per_client_ledgers=True, boundary="client", divides_by="participants",
    client_hparams=("update_noise",), recipe_prefix="ldp_laplace_"))
