"""L2 clipping of a client update (a pytree), flat or per part.

Flat, to norm C over all leaves together:
  clip(u, C) = u * min(1, C / ||u||_2)
Per part (each part p a set of leaves, e.g. one layer's kernel and bias):
  clip(u, C)_p = u_p * min(1, C_p / ||u_p||_2)
so ||clip(u)||_2 <= sqrt(sum_p C_p^2).

`l2_clip_reference` flattens and concatenates; `l2_clip` works leaf by leaf (no
concatenated copy of the update). Both return (clipped, norm before).
`per_part_clip` returns (clipped, [parts] norms before).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def global_norm(tree) -> jax.Array:
  return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))


def l2_clip_reference(tree, clip_norm):
  flat = jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(tree)])
  norm = jnp.linalg.norm(flat)
  scale = jnp.minimum(1.0, clip_norm / jnp.maximum(norm, 1e-30))
  return jax.tree.map(lambda x: x * scale, tree), norm


def l2_clip(tree, clip_norm):
  norm = global_norm(tree)
  scale = jnp.minimum(1.0, clip_norm / jnp.maximum(norm, 1e-30))
  return jax.tree.map(lambda x: x * scale.astype(x.dtype), tree), norm


def per_part_clip(tree, part_of_leaf: tuple, bounds: jax.Array):
  """Clips each part to its own bound; `bounds` [parts]. `part_of_leaf[i]` is the
  part of leaf i (in `jax.tree.leaves` order): an int for the whole leaf, or a
  tuple of ints, one per row (first axis), for a leaf split across parts (the
  first layer's kernel under sensitivity tiers: row f belongs to feature f)."""
  leaves, treedef = jax.tree.flatten(tree)
  num_parts = bounds.shape[0]
  sq, ids = [], []
  for x, p in zip(leaves, part_of_leaf):
    if isinstance(p, tuple):
      sq.append(jnp.sum(jnp.square(x).reshape(x.shape[0], -1), axis=1))
      ids.append(jnp.asarray(p, jnp.int32))
    else:
      sq.append(jnp.sum(jnp.square(x))[None])
      ids.append(jnp.full((1,), p, jnp.int32))
  norms = jnp.sqrt(jax.ops.segment_sum(jnp.concatenate(sq), jnp.concatenate(ids),
                                       num_segments=num_parts))
  scales = jnp.minimum(1.0, bounds / jnp.maximum(norms, 1e-30))
  out = [x * part_values(scales, p, x).astype(x.dtype) for x, p in zip(leaves, part_of_leaf)]
  return jax.tree.unflatten(treedef, out), norms


def part_values(values: jax.Array, part, x) -> jax.Array:
  """values[part] shaped to broadcast against leaf x: a scalar for a whole-leaf
  part, [rows, 1, ...] for a leaf split by rows."""
  if isinstance(part, tuple):
    return values[jnp.asarray(part, jnp.int32)].reshape((x.shape[0],) + (1,) * (x.ndim - 1))
  return values[part]
