"""A 2-D convolution whose gradients are convolutions XLA:CPU runs fast inside loops.

Alone, XLA:CPU rewrites a convolution's kernel and input gradients into its
canonical form (batch, spatial, features; kernel spatial, in, out), which its Eigen
path runs; inside a while body (a client's local steps) it leaves them as autodiff
wrote them (`dim_labels=f01b_i01o->01bf`) and runs them on a generic loop, about
30x slower (ResNet-18's step: 0.47 s alone, 15 s in `lax.fori_loop`). Here the
backward pass writes both gradients in the canonical form itself, so they run on
the fast path wherever they are: the kernel gradient as a convolution of the
inputs (their channels as the batch) with the output gradient (as the kernel, its
taps `stride` apart), the input gradient as a convolution of the output gradient
(its rows `stride` apart) with the flipped kernel. Same numbers as autodiff's
convolutions to float summation order.

Pass `conv_general_dilated` to flax's `nn.Conv(conv_general_dilated=...)`: the
parameters are nn.Conv's own. Only NHWC inputs with HWIO kernels, no dilation and
one feature group take this path; any other call is lax's.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax

_DN = ("NHWC", "HWIO", "NHWC")


def _pads(padding, in_hw, window, strides) -> tuple[tuple[int, int], ...]:
  if isinstance(padding, str):
    return tuple(lax.padtype_to_pads(in_hw, window, strides, padding))
  return tuple((int(lo), int(hi)) for lo, hi in padding)


def _canonical(dimension_numbers) -> bool:
  spec = lax.conv_dimension_numbers((1, 1, 1, 1), (1, 1, 1, 1), _DN)
  return dimension_numbers is None or dimension_numbers == spec or dimension_numbers == _DN


def conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation=None,
                         rhs_dilation=None, dimension_numbers=None, feature_group_count=1,
                         precision=None):
  """lax.conv_general_dilated's signature (what nn.Conv calls)."""
  dilated = any(d != 1 for d in (lhs_dilation or ())) or any(d != 1 for d in (rhs_dilation or ()))
  if (lhs.ndim != 4 or dilated or feature_group_count != 1
      or not _canonical(dimension_numbers)):
    return lax.conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation,
                                    rhs_dilation, dimension_numbers, feature_group_count,
                                    precision=precision)
  strides = tuple(int(s) for s in window_strides)
  pads = _pads(padding, lhs.shape[1:3], rhs.shape[:2], strides)
  return _conv(lhs, rhs, strides, pads, precision)


def _forward(x, w, strides, pads, precision):
  return lax.conv_general_dilated(x, w, strides, pads, dimension_numbers=_DN,
                                  precision=precision)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _conv(x, w, strides, pads, precision):
  """x [B, H, W, C], w [kh, kw, C, O] -> [B, H', W', O]."""
  return _forward(x, w, strides, pads, precision)


def _conv_fwd(x, w, strides, pads, precision):
  return _forward(x, w, strides, pads, precision), (x, w)


def _conv_bwd(strides, pads, precision, res, g):
  """(dx [B, H, W, C], dw [kh, kw, C, O]) for the output gradient g [B, H', W', O]."""
  x, w = res
  (kh, kw), (h, wd), (gh, gw) = w.shape[:2], x.shape[1:3], g.shape[1:3]
  # dw[a, b, c, o] = sum x_pad[n, i s + a, j s + b, c] g[n, i, j, o]: the inputs'
  # channels as the batch, the examples as the features, g as a kernel dilated by s
  dw_pads = tuple((lo, k + s * (m - 1) - n - lo) for (lo, _), k, s, m, n in
                  zip(pads, (kh, kw), strides, (gh, gw), (h, wd)))
  dw = lax.conv_general_dilated(jnp.transpose(x, (3, 1, 2, 0)), jnp.transpose(g, (1, 2, 0, 3)),
                                (1, 1), dw_pads, rhs_dilation=strides, dimension_numbers=_DN,
                                precision=precision)                      # [C, kh, kw, O]
  # dx: g with its rows s apart, against the kernel flipped, its in and out swapped
  dx_pads = []
  for (lo, _), k, s, m, n in zip(pads, (kh, kw), strides, (gh, gw), (h, wd)):
    p_lo = k - 1 - lo
    dx_pads.append((p_lo, n + k - 1 - (s * (m - 1) + 1) - p_lo))
  w_flip = jnp.transpose(w[::-1, ::-1], (0, 1, 3, 2))                      # [kh, kw, O, C]
  dx = lax.conv_general_dilated(g, w_flip, (1, 1), tuple(dx_pads), lhs_dilation=strides,
                                dimension_numbers=_DN, precision=precision)
  return dx, jnp.transpose(dw, (1, 2, 0, 3)).astype(w.dtype)


_conv.defvjp(_conv_fwd, _conv_bwd)
