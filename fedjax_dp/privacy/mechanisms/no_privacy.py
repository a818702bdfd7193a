"""No privacy: the uploads go as they are and the aggregate is FedAvg's
example-weighted mean; nothing is released under a guarantee (event -1)."""

from __future__ import annotations

import jax.numpy as jnp

from fedjax_dp.privacy.mechanisms.base import Mechanism, everyone, static_plan


def release(setup, delta, state, plan, adm, ids, participants, unclipped, key, clip_norm, hp):
  """The aggregate as it is; the ledger and the clip norm unchanged."""
  return delta, state.privacy._replace(clip_norm=clip_norm), jnp.int32(-1)


def no_privacy() -> Mechanism:
  return Mechanism("none", plan=static_plan, admit=everyone, release=release, private=False,
                   boundary=None, divides_by="examples")
