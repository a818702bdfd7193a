"""What happens to the cohort's uploads between the clients' training and the
aggregate, as one chain of stages on the round's stage protocol (fedjax_dp/stage.py):

  stage.update(uploads, (), ctx) -> (uploads, (), metrics)

`uploads` (Uploads) is this device's slice of the cohort as the server sees it:
the stacked updates (or, where the executor fused the sum into the client loop,
nothing to change), the participation mask, the example counts and the
aggregation weights; the stages keep no state; `metrics` is the stage's own named
counts over this device's slice, summed over the devices into
RoundStats.metrics[its name].

The chain's order comes from where each stage sits relative to the mechanism's
trust boundary (privacy/boundary.py), never from its name:

  protocol stages       an audit's canary clients (part of the honest protocol)
  sent, server boundary Byzantine clients' replacements, which the trusted
                        server then clips as any upload it receives
  the mechanism         its client half over the stack (clip, local noise); its
                        norms' counts where the executor ran it in the loop
  sent, client boundary Byzantine replacements of the noised reports
  the server's          its norm bound on every received upload, the shuffler's
                        uniform weights

Each stage is built only where the run has it (`chain`, once per simulation), so
a run without attacks, canaries or server clipping traces none of their code. A
stage's static properties are what the executor plans by: `inspects_uploads` (it
needs the cohort's uploads one by one, so the executor stacks them rather than
summing inside the client loop) and `uniform_weights` (the aggregate weights every
participant alike).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dp import stage as stage_lib
from fedjax_dp.kernels import clipping
from fedjax_dp.placement.executor import sum_over_devices


class Uploads(NamedTuple):
  """This device's slice of the cohort's uploads, [local] first axes."""
  deltas: Any            # pytree of [local, ...]; () where the sum was fused in the loop
  mask: jax.Array        # [local] bool: took part
  counts: jax.Array      # [local] int32 example counts (0 where not taking part)
  weights: jax.Array     # [local] float32 aggregation weights (FedAvg: the counts)
  nonfinite: jax.Array   # [local] bool: an upload with a NaN or inf, sent as zero


class UploadContext(NamedTuple):
  """What the stages read of the round (static set-up is in the stages themselves)."""
  ids: jax.Array         # [local] int32 client ids
  round_key: jax.Array
  clip_norm: jax.Array   # this round's clip norm (the mechanism's)
  client_hp: dict        # this round's client hyperparameters
  client: Callable | None  # the mechanism's client half bound to this round,
                           # (upload, id) -> (upload, norm); None without one
  in_loop: bool          # the executor summed the uploads in the client loop (the
                         # client half ran there; `deltas` is then ())
  loop_norms: Any        # [local] the mechanism's norms where it ran in the client loop, or ()


class UploadStage(NamedTuple):
  """One stage: update(uploads, (), ctx) -> (uploads, (), metrics), and its static
  properties."""
  name: str
  update: Callable[[Uploads, tuple, UploadContext], tuple[Uploads, tuple, dict]]
  inspects_uploads: bool = False   # reads or replaces uploads one by one
  uniform_weights: bool = False    # sets every participant's weight alike
  init: Callable = lambda: ()      # stateless


def canary_stage(canary: Callable) -> UploadStage:
  """An audit's canary clients replace their slots' uploads; scale 0 takes them out."""
  def update(u: Uploads, state, ctx: UploadContext):
    deltas, present = canary(u.deltas, ctx.ids, ctx.clip_norm,
                             ctx.client_hp["audit_canary_scale"])
    mask = u.mask & present
    counts = jnp.where(mask, u.counts, 0)
    return u._replace(deltas=deltas, mask=mask, counts=counts,
                      weights=counts.astype(jnp.float32)), state, {}
  return UploadStage("canary", update, inspects_uploads=True)


def attack_stage(byzantine: Callable) -> UploadStage:
  """Byzantine clients replace what they send (adversary/attacks.py)."""
  def update(u: Uploads, state, ctx: UploadContext):
    return u._replace(deltas=byzantine(u.deltas, ctx.ids, u.mask, ctx.round_key,
                                       sum_over_devices)), state, {}
  return UploadStage("attack", update, inspects_uploads=True)


def mechanism_stage(divides_by: str) -> UploadStage:
  """The mechanism's client half (ctx.client) over the stack, unless the executor
  ran it in the client loop; its weights (uniform unless it divides by examples)
  and its counts: uploads within the clip norm, and those sent as zero for a norm
  that is not finite."""
  def update(u: Uploads, state, ctx: UploadContext):
    if divides_by != "examples":
      u = u._replace(weights=u.mask.astype(jnp.float32))
    if ctx.client is None:
      return u, state, {}
    norms = ctx.loop_norms
    if not ctx.in_loop:   # the uploads are stacked (a later stage reads them)
      deltas, norms = jax.vmap(ctx.client)(u.deltas, ctx.ids)
      u = u._replace(deltas=deltas)
    unclipped = jnp.sum((norms <= ctx.clip_norm) & u.mask, dtype=jnp.int32)
    return u._replace(nonfinite=u.nonfinite | (~jnp.isfinite(norms) & u.mask)), state, {
        "unclipped": unclipped}
  return UploadStage("mechanism", update, uniform_weights=divides_by != "examples")


def server_clip_stage(bound: float) -> UploadStage:
  """The server's norm bound on every upload it received, the attackers' included,
  and how many it clipped."""
  def update(u: Uploads, state, ctx: UploadContext):
    deltas, norms = jax.vmap(lambda v: clipping.l2_clip(v, bound))(u.deltas)
    return u._replace(deltas=deltas), state, {
        "bounded": jnp.sum(u.mask & (norms > bound), dtype=jnp.int32)}
  return UploadStage("server_clip", update, inspects_uploads=True)


def shuffle_stage() -> UploadStage:
  """The shuffler hands the server, per layer, the cohort's tuples in random order:
  the server cannot link sizes to updates, so it weights uniformly. The server's
  plain sum of each layer's multiset is the same for every permutation, and the
  robust rules refuse shuffled tuples (recipes/validate.py), so the rows are not
  permuted (pipeline.layerwise_shuffle): on CPU the permutation cost 7 % of a
  TopkSDP-FL round and changed no number beyond float summation order."""
  def update(u: Uploads, state, ctx: UploadContext):
    return u._replace(weights=u.mask.astype(jnp.float32)), state, {}
  return UploadStage("shuffle", update, uniform_weights=True)


def chain(*, canary: Callable | None, byzantine: Callable | None, attack_before: bool,
          divides_by: str, server_clip: float | None, shuffle: bool) -> tuple[UploadStage, ...]:
  """The run's stages in their order (module docstring). attack_before: the
  attack acts on what a trusted server receives (a server boundary, or none)."""
  attack = [attack_stage(byzantine)] if byzantine is not None else []
  return tuple(([canary_stage(canary)] if canary is not None else []) +
               (attack if attack_before else []) +
               [mechanism_stage(divides_by)] +
               ([] if attack_before else attack) +
               ([server_clip_stage(server_clip)] if server_clip is not None else []) +
               ([shuffle_stage()] if shuffle else []))


def inspects_uploads(stages: tuple[UploadStage, ...]) -> bool:
  """Whether a stage needs the cohort's uploads one by one (the executor stacks them)."""
  return any(s.inspects_uploads for s in stages)


def uniform_weights(stages: tuple[UploadStage, ...]) -> bool:
  """Whether the aggregate weights every participant alike rather than by its
  example count (FedAvg): the mechanism divides by participants or the expected
  cohort, or the shuffler hides the sizes."""
  return any(s.uniform_weights for s in stages)


def run_chain(stages: tuple[UploadStage, ...], u: Uploads,
              ctx: UploadContext) -> tuple[Uploads, dict]:
  """The stages in order (stage.chain_update) -> (uploads, {stage name: metrics} over
  this device's slice)."""
  u, _, metrics = stage_lib.chain_update(stages)(u, tuple(s.init() for s in stages), ctx)
  return u, metrics
