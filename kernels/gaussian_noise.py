"""Gaussian noise for a pytree, one independent stream per leaf.

  noise(tree, key, std)_leaf = std_leaf * N(0, I),  key_leaf = fold_in(key, leaf index)

`std` is a scalar or one value per leaf (per-part noise). Callers derive `key`
per client and per round (fold_in of the client id into the round's purpose
key), so no two clients and no two rounds share a stream.

`gaussian_noise_reference` draws one flat vector and splits it;
`gaussian_noise_leafwise` draws leaf by leaf (no concatenated copy). The two
give different (equally distributed) numbers; the round uses the leaf-wise one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _leaf_stds(tree, std):
  leaves = jax.tree.leaves(tree)
  if isinstance(std, (list, tuple)):
    if len(std) != len(leaves):
      raise ValueError(f"{len(std)} noise stds for {len(leaves)} leaves")
    return list(std)
  return [std] * len(leaves)


def gaussian_noise_reference(tree, key: jax.Array, std):
  leaves, treedef = jax.tree.flatten(tree)
  sizes = [int(np.prod(x.shape)) for x in leaves]
  flat = jax.random.normal(key, (sum(sizes),), jnp.float32)
  out, start = [], 0
  for x, n, s in zip(leaves, sizes, _leaf_stds(tree, std)):
    out.append((s * flat[start:start + n]).reshape(x.shape).astype(x.dtype))
    start += n
  return jax.tree.unflatten(treedef, out)


def gaussian_noise_leafwise(tree, key: jax.Array, std):
  leaves, treedef = jax.tree.flatten(tree)
  out = [(s * jax.random.normal(jax.random.fold_in(key, i), x.shape, jnp.float32)).astype(x.dtype)
         for i, (x, s) in enumerate(zip(leaves, _leaf_stds(tree, std)))]
  return jax.tree.unflatten(treedef, out)


gaussian_noise = gaussian_noise_leafwise


def add_gaussian_noise(tree, key: jax.Array, std):
  """tree + gaussian_noise(tree, key, std)."""
  return jax.tree.map(jnp.add, tree, gaussian_noise(tree, key, std))
