"""L2 clipping of a client update (a pytree) to norm C.

  clip(u, C) = u * min(1, C / ||u||_2),  ||u||_2 over all leaves together

`l2_clip_reference` flattens and concatenates; `l2_clip` works leaf by leaf
(no concatenated copy of the update). Both return (clipped, norm before).
"""

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
