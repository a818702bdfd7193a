"""Weighted mean over the client axis: the FedAvg aggregation kernel.

  mean(a, w) = sum_i w_i a_i / sum_i w_i,   a: [clients, ...], w: [clients]

`weighted_sum_reference` broadcasts and reduces; `weighted_sum_tensordot`
contracts the client axis as a matrix-vector product. On XLA:CPU a reduction
over the leading axis of a [96, 784, 200] array took 106 ms against 2.4 ms for
the contraction (shared/JAX_NOTES.md), so the round uses the tensordot form.
"""

import jax
import jax.numpy as jnp


# aggregation's products stay float32 whatever the config's matmul_precision
EXACT = jax.lax.Precision.HIGHEST


def weighted_sum_reference(weights: jax.Array, tree):
  """sum_i w_i a_i for every leaf a: [clients, ...]; w: [clients]."""
  return jax.tree.map(
      lambda a: jnp.sum(weights.reshape((-1,) + (1,) * (a.ndim - 1)) * a, axis=0), tree)


def weighted_sum_tensordot(weights: jax.Array, tree):
  """Same as `weighted_sum_reference`, as one contraction per leaf.

  In float32 on every device: a GPU's default (TF32 tensor cores) would round each
  clipped update to 10 mantissa bits, a 3e-4 error (measured on an H100) and a
  norm up to 2**-11 over the clipping bound the noise is calibrated to."""
  return jax.tree.map(lambda a: jnp.tensordot(weights.astype(a.dtype), a, axes=1,
                                              precision=EXACT), tree)


weighted_sum = weighted_sum_tensordot
