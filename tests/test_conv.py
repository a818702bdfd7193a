"""models/conv.py: the convolution whose gradients are written in XLA:CPU's canonical
form gives lax's values and autodiff's gradients (bit for bit on this CPU, checked to
1e-6), over kernel sizes, strides and paddings; other calls are lax's own."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from fedjax_dp.models.conv import conv_general_dilated

DN = ("NHWC", "HWIO", "NHWC")
CASES = [c for c in itertools.product((7, 8), (1, 3, 5), (1, 2),
                                      ("SAME", "VALID", ((1, 1), (1, 1)), ((2, 0), (0, 1))))
         if not (c[3] == "VALID" and c[1] > c[0])]


@pytest.mark.parametrize("n, k, s, pad", CASES)
def test_values_and_gradients_are_laxs(n, k, s, pad):
  rng = np.random.default_rng(n * 100 + k * 10 + s)
  x = jnp.asarray(rng.normal(size=(2, n, n, 3)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(k, k, 3, 4)), jnp.float32)
  ref = lambda x, w: lax.conv_general_dilated(x, w, (s, s), pad, dimension_numbers=DN)
  ours = lambda x, w: conv_general_dilated(
      x, w, (s, s), pad, dimension_numbers=lax.conv_dimension_numbers(x.shape, w.shape, DN))
  np.testing.assert_allclose(ours(x, w), ref(x, w), rtol=1e-6, atol=1e-6)
  loss = lambda conv: lambda x, w: jnp.sum(jnp.sin(conv(x, w)))
  for a, b in zip(jax.grad(loss(ours), (0, 1))(x, w), jax.grad(loss(ref), (0, 1))(x, w)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(b))))


def test_inside_a_loop_the_same_steps():
  """A few SGD steps in lax.fori_loop (a client's local steps) give the steps run
  one by one with lax's gradients."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(4, 8, 8, 3)), jnp.float32)
  w0 = jnp.asarray(rng.normal(size=(3, 3, 3, 5)) * 0.1, jnp.float32)
  def step(conv):
    loss = lambda w: jnp.sum(conv(x, w, (2, 2), "SAME",
                                  dimension_numbers=lax.conv_dimension_numbers(
                                      x.shape, w.shape, DN)) ** 2)
    return lambda i, w: w - 1e-3 * jax.grad(loss)(w)
  looped = jax.jit(lambda w: lax.fori_loop(0, 3, step(conv_general_dilated), w))(w0)
  w = w0
  for i in range(3):
    w = step(lax.conv_general_dilated)(i, w)
  np.testing.assert_allclose(looped, w, rtol=1e-5, atol=1e-6)


def test_other_calls_are_laxs():
  x = jnp.ones((1, 6, 6, 4))
  w = jnp.ones((3, 3, 2, 4))   # two feature groups
  dn = lax.conv_dimension_numbers(x.shape, w.shape, DN)
  np.testing.assert_array_equal(
      conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dn, feature_group_count=2),
      lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dn,
                               feature_group_count=2))
