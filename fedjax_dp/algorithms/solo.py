"""SOLO: every client trains its own model from its own last one, never aggregated.

The client's state holds its model (every client starts from the same initial
model); its upload is zero and the round leaves the server model where it is.
"""

import jax
import jax.numpy as jnp

from fedjax_dp.algorithms.base import LocalTerm


def _finish(inputs, upload, state, hp):
  state = {**state, "model": inputs.keep(inputs.local_model, state["model"])}
  return jax.tree.map(jnp.zeros_like, inputs.delta), state, {}


_TERM = LocalTerm(name="solo", init_client=lambda params: {"model": params}, finish=_finish,
                  own_model=True,
                  outside_dp="SOLO's clients send nothing, and the per-client models it "
                             "evaluates are never noised, so no epsilon would describe the run; "
                             "use dp 'none'",
                  outside_kept_noise="SOLO's per-client models are evaluated and never noised, "
                                     "so no kept-noise guarantee would describe the run")


def solo() -> LocalTerm:
  """The SOLO term: each client trains its own model (no number)."""
  return _TERM
