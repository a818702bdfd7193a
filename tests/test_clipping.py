"""L2 clipping against numpy."""

import jax
import numpy as np
import pytest

from fedjax_dp.kernels import clipping


@pytest.mark.parametrize("fn", [clipping.l2_clip, clipping.l2_clip_reference])
@pytest.mark.parametrize("clip_norm", [0.1, 1.0, 1e6])
def test_clip_against_numpy(fn, clip_norm):
  rng = np.random.default_rng(0)
  tree = {"a": rng.normal(size=(4, 3)).astype(np.float32), "b": rng.normal(size=7).astype(np.float32)}
  flat = np.concatenate([tree["a"].ravel(), tree["b"]])
  norm = np.linalg.norm(flat)
  clipped, got_norm = jax.jit(fn)(tree, clip_norm)
  assert float(got_norm) == pytest.approx(norm, rel=1e-6)
  scale = min(1.0, clip_norm / norm)
  np.testing.assert_allclose(clipped["a"], tree["a"] * scale, rtol=1e-6)
  np.testing.assert_allclose(clipped["b"], tree["b"] * scale, rtol=1e-6)
  out = np.concatenate([np.ravel(clipped["a"]), np.ravel(clipped["b"])])
  assert np.linalg.norm(out) <= clip_norm * (1 + 1e-6)


def test_zero_update_stays_zero():
  clipped, norm = clipping.l2_clip({"a": np.zeros(5, np.float32)}, 1.0)
  assert float(norm) == 0.0 and not np.any(np.asarray(clipped["a"]))
