"""The update pipeline: optax-style stages between local training and aggregation.

A client stage is a pair of pure functions, as in optax, on the round's one stage
protocol (fedjax_dp/stage.py):

  init(d) -> state                    one client's state for a flat update of size d
  update(upload, state, ctx) -> (upload, state, metrics)

and `chain(*stages)` composes them; a stage's metrics (scalars, this client's) are
summed over the round's participants into RoundStats.metrics[its name]. Uploads are flat float32 vectors [d] with a
bool mask [d] of the coordinates that are sent (all, for a dense upload).
Stages (SparseRandom, TopkSDP-FL Algorithm 1, and its variants):

  clip_per_coordinate(C)   u <- clip(u, -C, C)
  clip_l2(C)               u <- u min(1, C / ||u||)
  topk_with_error_feedback(k, selection)
                           v = u + r;  S = select(v);  send v on S;  r <- v off S
                           (sent + new residual = update + old residual exactly)
                           selection: 'topk' (largest |v|), 'random_k' (from the
                           key), 'public_topk' (largest |previous global update|)
  gaussian_on_kept(std_fn) adds N(0, std^2) to the sent coordinates only; std_fn
                           maps the context to a std (TopkSDP-FL's calibrations:
                           privacy/mechanisms/kept_noise.py)

The server side has the layer-wise shuffler (a permutation of the cohort per
layer) and downlink top-k with a server residual (`downlink_topk`).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dp import stage as stage_lib
from fedjax_dp.kernels import topk as topk_kernels


class Upload(NamedTuple):
  values: jax.Array  # [d] float32; zero where not sent
  sent: jax.Array    # [d] bool
  # std of N(0, std^2) noise owed on the sent coordinates but not yet drawn
  # (gaussian_on_kept with draw='aggregate': the server draws the sum's noise)
  noise_std: Any = 0.0


class StageContext(NamedTuple):
  key: jax.Array            # this client's, this round's key for the pipeline
  num_examples: jax.Array   # n_i
  lr: jax.Array             # the round's client learning rate
  public_update: jax.Array  # [d] the previous round's global update (public)
  # the stage's numbers as data (a chain: a tuple, one per stage), as ClientStage.hparams
  # is laid out; () where the caller passes none: each stage then uses its constructor's
  hp: Any = ()


class ClientStage(NamedTuple):
  init: Callable[[int], Any]
  update: Callable[[Upload, Any, StageContext], tuple[Upload, Any, dict]]
  # static properties: what recipes (recipes/validate.py) check a combination by
  name: str = ""
  bound: float | None = None       # the norm it clips the upload to (per coordinate or L2)
  sparsifies: bool = False         # sends only some coordinates (top-k)
  private_positions: bool = False  # which coordinates are sent depends on the private update
  needs_sparsifier: bool = False   # acts on the sent coordinates: an earlier stage sparsifies
  needs_bound: bool = False        # calibrated to the bound an earlier stage clips to
  privatizes: bool = False         # adds noise meant as the upload's privacy guarantee
  owes_noise: bool = False         # leaves its noise for the server to draw on the aggregate
                                   # (exact only for a weighted sum of unchanged uploads)
  hparams: Any = ()                # its numbers {name: value} (a chain: a tuple, one per
                                   # stage): the round passes them back as traced arrays in
                                   # StageContext.hp (hyperparameters as data, recipes/hparams.py)
  declares: Any = ()               # its metrics' release declarations, ((name, status,
                                   # says), ...) (fedjax_dp/stage.py)


def numbers(ctx: StageContext, stage_hparams: dict) -> dict:
  """The numbers a stage computes with: the round's (ctx.hp, traced) where it
  passes them, else the stage's own constants."""
  return ctx.hp if isinstance(ctx.hp, dict) else stage_hparams


def chain(*stages: ClientStage) -> ClientStage:
  """Applies the stages in order (stage.chain_update: their states a tuple, their
  metrics by name); each gets its own key, fold_in(key, position)."""
  def init(d):
    return tuple(s.init(d) for s in stages)

  def ctx_for(i, ctx):
    hp = ctx.hp[i] if isinstance(ctx.hp, tuple) and ctx.hp else ()
    return ctx._replace(key=jax.random.fold_in(ctx.key, i), hp=hp)
  return ClientStage(init, stage_lib.chain_update(stages, ctx_for),
                     hparams=tuple(s.hparams for s in stages))


def identity() -> ClientStage:
  return ClientStage(lambda d: (), lambda u, s, ctx: (u, s, {}))


def clip_per_coordinate(clip: float) -> ClientStage:
  own = {"clip": clip}

  def update(u, s, ctx):
    c = numbers(ctx, own)["clip"]
    return u._replace(values=jnp.clip(u.values, -c, c)), s, {}
  return ClientStage(lambda d: (), update, name="clip_per_coordinate", bound=clip, hparams=own)


def clip_l2(clip: float) -> ClientStage:
  own = {"clip": clip}

  def update(u, s, ctx):
    c = numbers(ctx, own)["clip"]
    norm = jnp.linalg.norm(u.values)
    return u._replace(values=u.values * jnp.minimum(1.0, c / jnp.maximum(norm, 1e-30))), s, {}
  return ClientStage(lambda d: (), update, name="clip_l2", bound=clip, hparams=own)


def clip_sent(clip: float) -> ClientStage:
  """The L2 clip of the sent top-k vector (final_clip_l2). It runs inside
  topk_with_error_feedback (what it removes joins the residual); on its own it
  only names a clip that has no top-k to follow, which recipes refuse."""
  stage = clip_l2(clip)
  return stage._replace(name="clip_sent", needs_sparsifier=True)


def keep_count(d: int, sparsity: float) -> int:
  """k = (1 - s) d, at least 1."""
  return max(1, int(round((1.0 - sparsity) * d)))


TOPK_KERNELS = ("exact", "approx", "threshold", "bisect")


def topk_mask(v: jax.Array, k: int, key: jax.Array, kernel: str = "exact") -> jax.Array:
  """The largest-|v| mask by the named kernel (kernels/topk.py): 'exact'
  (lax.top_k, k kept), 'approx' (lax.approx_max_k at recall 0.95, k kept: the
  fast one on TPU; on CPU and GPU XLA runs it as an exact top-k), 'threshold'
  (sampled quantile trimmed to k, about 98 % recall), 'bisect' (an exact top-c
  for a c between 0.999 k and k, ties at the k-th value filled to k by index;
  the fastest on CPU)."""
  if kernel == "exact":
    return topk_kernels.topk_mask_exact(v, k)
  if kernel == "approx":
    return topk_kernels.topk_mask_approx(v, k)
  if kernel == "threshold":
    return topk_kernels.topk_mask_threshold(v, k, key)
  if kernel == "bisect":
    return topk_kernels.topk_mask_bisect(v, k, key)
  raise ValueError(f"top-k kernel {kernel!r}: allowed are {', '.join(TOPK_KERNELS)}")


def topk_with_error_feedback(sparsity: float, selection: str = "topk",
                             error_feedback: bool = True, kernel: str = "exact",
                             final_clip: float | None = None) -> ClientStage:
  """Keeps k = (1 - sparsity) d coordinates of update + residual; the rest becomes
  the new residual (or is dropped without error feedback). kernel: one of
  TOPK_KERNELS (topk_mask; times and recall in BENCHMARKS.md). final_clip: the sent vector is
  clipped to this L2 norm and what the clip removes joins the residual, so every
  upload's norm is bounded whatever the residual holds (needed for a complete
  guarantee: the residual carries earlier rounds' data)."""
  if selection not in ("topk", "random_k", "public_topk"):
    raise ValueError(f"index selection {selection!r}: allowed are topk, random_k, public_topk")
  own = {} if final_clip is None else {"final_clip": final_clip}

  def init(d):
    return jnp.zeros((d,), jnp.float32) if error_feedback else ()

  def update(u, residual, ctx):
    d = u.values.shape[0]
    k = keep_count(d, sparsity)
    v = u.values + residual if error_feedback else u.values
    if selection == "topk":
      mask = topk_mask(v, k, ctx.key, kernel)
    elif selection == "random_k":
      mask = topk_kernels.random_k_mask(ctx.key, d, k)
    else:
      mask = topk_mask(ctx.public_update, k, ctx.key, kernel)
    # only coordinates an earlier stage sent can be sent (a dense upload sends all)
    mask = mask & u.sent
    sent = jnp.where(mask, v, 0.0)
    if final_clip is not None:
      c = numbers(ctx, own)["final_clip"]
      sent = sent * jnp.minimum(1.0, c / jnp.maximum(jnp.linalg.norm(sent), 1e-30))
    new_residual = v - sent if error_feedback else ()
    return Upload(sent, mask), new_residual, {}
  return ClientStage(init, update, name="topk", bound=final_clip, sparsifies=True,
                     private_positions=selection == "topk", hparams=own)


def gaussian_on_kept(std_fn: Callable[[StageContext], jax.Array],
                     draw: str = "client", hparams: dict | None = None) -> ClientStage:
  """N(0, std^2) on each sent coordinate. draw='client' draws it here, from the
  client's key. draw='aggregate' only records the std in `Upload.noise_std`, and
  the server adds the noise of the weighted sum in one draw: for a linear
  aggregate sum_i w_i (v_i + n_i) with independent n_ic ~ N(0, std_i^2) on the
  sent coordinates, sum_i w_i n_i is exactly N(0, diag(sum_i w_i^2 std_i^2 sent_i)),
  so the aggregate has the same distribution, for one draw of d normals per
  round instead of one per client. Not for robust (non-linear) aggregators,
  nor where uploads are inspected one by one. std_fn sees ctx.hp = the stage's
  numbers (`hparams`, or the round's as data)."""
  if draw not in ("client", "aggregate"):
    raise ValueError(f"noise draw {draw!r}: allowed are client, aggregate")
  own = hparams or {}

  def update(u, s, ctx):
    std = std_fn(ctx._replace(hp=numbers(ctx, own)))
    if draw == "aggregate":
      return u._replace(noise_std=std), s, {}
    noise = std * jax.random.normal(ctx.key, u.values.shape, u.values.dtype)
    return u._replace(values=u.values + jnp.where(u.sent, noise, 0.0)), s, {}
  return ClientStage(lambda d: (), update, name="gaussian_on_kept", needs_sparsifier=True,
                     needs_bound=True, privatizes=True, owes_noise=draw == "aggregate",
                     hparams=own)


def aggregate_noise_var(weights: jax.Array, noise_std: jax.Array, sent: jax.Array) -> jax.Array:
  """Per-coordinate variance [d] of sum_i w_i n_i, n_ic ~ N(0, noise_std_i^2) where
  sent_ic: sum_i w_i^2 noise_std_i^2 sent_ic. weights, noise_std [m]; sent [m, d] bool."""
  return jnp.tensordot(jnp.square(weights * noise_std), sent.astype(jnp.float32), 1,
                       precision=jax.lax.Precision.HIGHEST)


# ------------------------------------------------------------------ server side


class Shuffler(NamedTuple):
  """A permutation of the cohort's uploads before aggregation, and its static property."""
  name: str
  shuffle: Callable               # (uploads [m, ...] pytree, key) -> uploads
  needs_linear_aggregate: bool = True   # the result is a multiset of per-layer tuples: only
                                        # a sum over the cohort is defined on it


def layerwise_shuffle(uploads, key: jax.Array):
  """Per layer (leaf), a random permutation of the cohort axis: leaves [m, ...].

  The server then holds, per layer, the multiset of the cohort's tuples with no
  link between one client's layers."""
  leaves, treedef = jax.tree.flatten(uploads)
  out = [leaf[jax.random.permutation(jax.random.fold_in(key, i), leaf.shape[0])]
         for i, leaf in enumerate(leaves)]
  return jax.tree.unflatten(treedef, out)


SHUFFLERS = {"layerwise": Shuffler("layerwise", layerwise_shuffle)}


def downlink_topk(update: jax.Array, residual: jax.Array, sparsity: float,
                  key: jax.Array | None = None, kernel: str = "exact"):
  """Server-side top-k with error feedback on the flat aggregate [d]:
  (broadcast [d], sent mask [d], new residual [d]). `key` is needed by the
  sampling kernels ('threshold', 'bisect')."""
  v = update + residual
  mask = topk_mask(v, keep_count(v.shape[0], sparsity), key, kernel)
  sent = jnp.where(mask, v, 0.0)
  return sent, mask, v - sent


def sparse_bytes(d: int, k: int, value_bytes: int = 4, index_bytes: int = 4) -> tuple[int, str]:
  """Bytes to send k of d float32 values: k values with 32-bit indices, or with a
  d-bit bitmap when that is smaller; dense (no indices) when k = d."""
  if k >= d:
    return d * value_bytes, "dense float32"
  with_indices = k * (value_bytes + index_bytes)
  with_bitmap = k * value_bytes + (d + 7) // 8
  if with_indices <= with_bitmap:
    return with_indices, "float32 values + int32 indices"
  return with_bitmap, "float32 values + d-bit bitmap"


def communication(d: int, s_local: float, s_global: float, terms: tuple[str, ...]) -> dict:
  """Bytes per participant and round, each way, and the encodings, for a model of
  d parameters, the up and down links' top-k fractions (0: dense) and the local terms.

  The model update as the pipeline sends it (sparse_bytes), plus what the
  algorithm itself exchanges: SCAFFOLD's control variates, dense both ways
  (c_i' - c_i up, c down); SOLO exchanges nothing (no server). The down link is
  one round's broadcast per participant: a client that missed rounds would in
  practice also need the updates it missed, which is not counted."""
  if "solo" in terms:
    none = "nothing (SOLO: every client trains alone)"
    return {"bytes_per_client_up": 0, "bytes_per_client_down": 0, "k_up": 0, "k_down": 0,
            "encoding_up": none, "encoding_down": none}
  up_k = keep_count(d, s_local) if s_local > 0 else d
  down_k = keep_count(d, s_global) if s_global > 0 else d
  up, up_enc = sparse_bytes(d, up_k)
  down, down_enc = sparse_bytes(d, down_k)
  if "scaffold" in terms:
    control, _ = sparse_bytes(d, d)
    up, down = up + control, down + control
    up_enc += " + dense float32 control variate change c_i' - c_i (SCAFFOLD)"
    down_enc += " + dense float32 server control variate c (SCAFFOLD)"
  return {"bytes_per_client_up": up, "bytes_per_client_down": down, "k_up": up_k,
          "k_down": down_k, "encoding_up": up_enc, "encoding_down": down_enc}
