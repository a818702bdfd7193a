"""Clip layouts, clipping and noise of client updates, used by the mechanisms (mechanisms/).

* Clipping, flat or per layer. Per layer, part p (a layer's kernel and bias)
  is clipped to C_p = C sqrt(d_p / d), so sum_p C_p^2 = C^2 and the clipped
  update still has norm <= C. The noise stays isotropic, std z C, so
  in the accountant's terms each part is a Gaussian with multiplier
  z C / C_p, and the parts compose to one Gaussian with multiplier
  (sum_p (C_p / (z C))^2)^(-1/2) = z: per-layer clipping changes the
  mechanism's bias, not its epsilon (`part_noise_multipliers`).
* Adaptive clipping to a target quantile (Andrew, Thakkar, McMahan,
  Ramaswamy 2021): each client also reports b_i = 1[||u_i|| <= C_t]; the
  server releases sum_i (b_i - 1/2) + N(0, s^2) and moves the clip norm
  geometrically,
    b~ = released / m + 1/2,   C_{t+1} = C_t exp(-eta (b~ - gamma)),
  with m the expected cohort size. The count's sensitivity is 1/2, so the
  pair (update sum, count) is one Gaussian with multiplier z when the
  updates get z_u = (z^-2 - (2 s)^-2)^(-1/2) (their Theorem 1); with clip
  parts of weight S (tiers) the pair keeps the parts' multiplier z / sqrt(S)
  with z_u = (z^-2 - (4 s^2 S)^-1)^(-1/2) (`update_noise_multiplier`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.kernels import clipping, gaussian_noise


class ClipLayout(NamedTuple):
  """How an update is split for clipping and noise; static (hashable)."""
  part_of_leaf: tuple            # part of each leaf, in jax.tree.leaves order: an int,
                                 # or a tuple with a part per row (first axis)
  fractions: tuple[float, ...]   # C_p / C per part; their squares sum to 1
  names: tuple[str, ...]         # a name per part, for reports
  noise_scales: tuple[float, ...] | None = None  # part p's noise std is z C scale_p
                                                 # (None: isotropic, all 1)


def clip_layout(params, scheme: str) -> ClipLayout:
  """'flat': one part. 'per_layer': one part per layer (leaves sharing a path
  prefix, e.g. Dense_0/kernel and Dense_0/bias), bound proportional to sqrt(size)."""
  paths_leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  if scheme == "flat":
    return ClipLayout((0,) * len(paths_leaves), (1.0,), ("all",))
  if scheme != "per_layer":
    raise ValueError(f"clip scheme {scheme!r}: allowed values are flat, per_layer")
  names: list[str] = []
  part_of_leaf = []
  sizes: dict[int, int] = {}
  for path, leaf in paths_leaves:
    name = "/".join(str(getattr(k, "key", k)) for k in path[:-1]) or "root"
    if name not in names:
      names.append(name)
    p = names.index(name)
    part_of_leaf.append(p)
    sizes[p] = sizes.get(p, 0) + int(np.prod(leaf.shape))
  total = sum(sizes.values())
  fractions = tuple(math.sqrt(sizes[p] / total) for p in range(len(names)))
  return ClipLayout(tuple(part_of_leaf), fractions, tuple(names))


def tier_layout(params, feature_tiers, rest_tier: int, multipliers) -> ClipLayout:
  """Sensitivity tiers as clip parts: row f of the first layer's kernel (the
  weights of input feature f) takes feature f's tier, every other parameter
  `rest_tier`. Part t (one per tier present) is clipped to C_t = C sqrt(d_t / d)
  and noised with std z C multipliers[t]: as a Gaussian it has multiplier
  z_t = z multipliers[t] / sqrt(d_t / d), and the tiers compose (RDP adds; one
  Gaussian of multiplier (sum_t z_t^-2)^(-1/2), `part_noise_multipliers`)."""
  from fedjax_dp.data.tabular import TIERS
  paths_leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  feature_tiers = np.asarray(feature_tiers, np.int32)
  first = [i for i, (path, leaf) in enumerate(paths_leaves)
           if len(leaf.shape) == 2 and leaf.shape[0] == feature_tiers.shape[0]]
  if not first:
    raise ValueError(f"no parameter has {feature_tiers.shape[0]} rows (one per feature): "
                     "sensitivity tiers need an MLP on tabular data")
  first_kernel = first[0]
  present = sorted(set(feature_tiers.tolist()) | {rest_tier})
  index = {t: j for j, t in enumerate(present)}
  part_of_leaf, sizes = [], [0] * len(present)
  for i, (path, leaf) in enumerate(paths_leaves):
    if i == first_kernel:
      rows = tuple(index[int(t)] for t in feature_tiers)
      part_of_leaf.append(rows)
      for r in rows:
        sizes[r] += int(np.prod(leaf.shape[1:]))
    else:
      part_of_leaf.append(index[rest_tier])
      sizes[index[rest_tier]] += int(np.prod(leaf.shape))
  total = sum(sizes)
  return ClipLayout(tuple(part_of_leaf), tuple(math.sqrt(n / total) for n in sizes),
                    tuple(TIERS[t] for t in present),
                    tuple(float(multipliers[t]) for t in present))


def noise_std_per_leaf(layout: ClipLayout, std, tree, scales=None) -> list:
  """The noise std of every leaf of `tree`, for kernels/gaussian_noise: `std`
  times the part's noise scale (a scalar, or [rows, 1, ...] for a leaf split by
  rows). `scales` [parts] overrides the layout's (adaptive noise)."""
  leaves = jax.tree.leaves(tree)
  if scales is None and layout.noise_scales is None:
    return [std] * len(leaves)
  scales = jnp.asarray(layout.noise_scales if scales is None else scales, jnp.float32)
  if scales.shape == ():
    return [std * scales] * len(leaves)
  return [std * clipping.part_values(scales, p, x) for p, x in zip(layout.part_of_leaf, leaves)]


def clip_update(update, clip_norm: jax.Array, layout: ClipLayout):
  """(clipped update, L2 norm before clipping) for one client's update.

  An update whose norm is not finite (a NaN or inf in it, or squares past
  float32's range) is sent as zero: C / ||u|| would make it NaN, and one NaN
  upload makes the whole released sum NaN. The select fuses with the scaling."""
  if len(layout.fractions) == 1:
    clipped, norm = clipping.l2_clip(update, clip_norm)
  else:
    bounds = clip_norm * jnp.asarray(layout.fractions, jnp.float32)
    clipped, norms = clipping.per_part_clip(update, layout.part_of_leaf, bounds)
    norm = jnp.sqrt(jnp.sum(jnp.square(norms)))
  finite = jnp.isfinite(norm)
  return jax.tree.map(lambda x: jnp.where(finite, x, 0.0), clipped), norm


def add_client_noise(updates, client_ids: jax.Array, noise_key: jax.Array, std,
                     layout: ClipLayout | None = None, scales=None, client_factor=None):
  """Local DP over a stack: add_one_client_noise for each client. updates: pytree
  of [clients, ...]; client_ids: [clients]; client_factor [clients]: each
  client's std multiplier (per-cluster noise; default 1)."""
  factor = (jnp.ones(client_ids.shape, jnp.float32) if client_factor is None
            else client_factor)
  return jax.vmap(lambda u, c, f: add_one_client_noise(u, c, noise_key, std, layout, scales, f)
                  )(updates, client_ids, factor)


def add_one_client_noise(update, client_id: jax.Array, noise_key: jax.Array, std,
                         layout: ClipLayout | None = None, scales=None, factor=1.0):
  """Local DP: adds N(0, (std factor)^2 I) to one client's update (std scaled per
  part under a layout with noise scales), from the client's own stream
  fold_in(noise_key, client id). `noise_key` is the round's local-noise key, so no
  stream repeats across clients or rounds."""
  s = std * factor
  stds = s if layout is None else noise_std_per_leaf(layout, s, update, scales)
  return gaussian_noise.add_gaussian_noise(update, jax.random.fold_in(noise_key, client_id),
                                           stds)


def part_noise_multipliers(layout: ClipLayout, noise_multiplier: float) -> list[float]:
  """Each part's noise multiplier: its std z C scale_p over its bound C_p."""
  scales = layout.noise_scales or (1.0,) * len(layout.fractions)
  return [noise_multiplier * s / f for f, s in zip(layout.fractions, scales)]


def update_noise_multiplier(noise_multiplier: float, count_stddev: float,
                            weight: float = 1.0) -> float:
  """z_u for the clipped updates when the clipped count takes std `count_stddev`,
  so that the pair costs what one Gaussian with the updates' planned multiplier
  z / sqrt(S) does. S = `weight` = sum_p (f_p / scale_p)^2 over the clip parts
  (1 for flat, per-layer and any isotropic layout): the updates' parts compose to
  z_u / sqrt(S), the count (sensitivity 1/2) to 2 s, and
    S / z_u^2 + 1 / (2 s)^2 = S / z^2   <=>   z_u = (z^-2 - (4 s^2 S)^-1)^(-1/2)."""
  if noise_multiplier == 0:
    return 0.0
  rest = noise_multiplier ** -2 - 1.0 / (4.0 * count_stddev ** 2 * weight)
  if rest <= 0:
    planned = noise_multiplier / math.sqrt(weight)
    raise ValueError(f"clip_count_stddev = {count_stddev:g}: adaptive clipping needs it "
                     f"> the accounted noise multiplier / 2 = {planned / 2:g}")
  return rest ** -0.5


def adaptive_clip_norm(clip_norm: jax.Array, below_minus_half: jax.Array, key: jax.Array,
                       expected_cohort: float, target_quantile: float, clip_lr: float,
                       count_stddev: float) -> jax.Array:
  """C_{t+1} from C_t and sum_i (b_i - 1/2) over the cohort (noised here)."""
  released = below_minus_half + count_stddev * jax.random.normal(key, (), jnp.float32)
  fraction_below = released / expected_cohort + 0.5
  return clip_norm * jnp.exp(-clip_lr * (fraction_below - target_quantile))
