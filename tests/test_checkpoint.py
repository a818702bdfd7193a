"""Checkpoints: the state digest saved with each one catches bytes changed in place."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.experiment import checkpoint


def _state(v):
  return {"w": jnp.full((3, 4), v, jnp.float32), "n": jnp.asarray(v, jnp.int32)}


def test_digest_is_over_dtype_shape_and_bytes():
  a = checkpoint.state_digest(_state(1))
  assert a == checkpoint.state_digest(_state(1)) and a != checkpoint.state_digest(_state(2))
  assert checkpoint.state_digest({"w": jnp.zeros((2, 6))}) != checkpoint.state_digest(
      {"w": jnp.zeros((3, 4))})


def test_digest_matches_a_plain_sha256_over_each_leafs_bytes():
  """The digest hashes the leaves' buffers in place; it must stay the digest that
  checkpoints already on disk were saved with: dtype, shape (as np.ascontiguousarray
  gives it: a scalar's is (1,)), then tobytes()."""
  import hashlib
  import ml_dtypes
  state = {"a": jnp.arange(12, dtype=jnp.float32).reshape(3, 4), "b": jnp.zeros((0, 3)),
           "c": jnp.asarray(2.5, ml_dtypes.bfloat16), "d": jnp.asarray([True, False])}
  h = hashlib.sha256()
  for leaf in [state[k] for k in "abcd"]:
    a = np.ascontiguousarray(leaf)
    h.update(f"{a.dtype.str}{a.shape}".encode() + a.tobytes())
  assert checkpoint.state_digest(state) == h.hexdigest()


def test_a_checkpoint_whose_state_no_longer_matches_its_digest_is_skipped(tmp_path):
  d = str(tmp_path / "ckpt")
  checkpoint.save(d, 1, _state(1), {"round": 1})
  checkpoint.save(d, 2, _state(2), {"round": 2})
  step, state, meta = checkpoint.restore_latest(d, _state(0))
  assert step == 2 and meta == {"round": 2} and int(state["n"]) == 2
  # what a changed byte does to the restored state, simulated on the saved digest: orbax
  # reads both without complaint, only the digest can tell
  metas = [os.path.join(root, f) for root, _, files in os.walk(os.path.join(d, "2", "meta"))
           for f in files if f.endswith("metadata") or f.endswith(".json")]
  assert metas, os.listdir(os.path.join(d, "2", "meta"))
  for path in metas:
    with open(path) as f:
      saved = json.load(f)
    if checkpoint.DIGEST_KEY in saved:
      saved[checkpoint.DIGEST_KEY] = checkpoint.state_digest(_state(3))
      with open(path, "w") as f:
        json.dump(saved, f)
  warnings = []
  step, state, meta = checkpoint.restore_latest(d, _state(0), warn=warnings.append)
  assert step == 1 and int(state["n"]) == 1
  assert len(warnings) == 1 and "round 2" in warnings[0] and "digest" in warnings[0]


def test_bytes_flipped_inside_a_data_file_are_caught(tmp_path):
  d = str(tmp_path / "ckpt")
  state = lambda v: {"w": jnp.arange(100000, dtype=jnp.float32) * v}
  checkpoint.save(d, 1, state(1), {})
  checkpoint.save(d, 2, state(2), {})
  files = [os.path.join(root, f) for root, _, fs in os.walk(os.path.join(d, "2", "state"))
           for f in fs]
  data = max(files, key=os.path.getsize)      # the array chunks; same size after the flip
  b = bytearray(open(data, "rb").read())
  for i in range(len(b) // 2, len(b) // 2 + 256):
    b[i] ^= 0xFF
  open(data, "wb").write(bytes(b))
  warnings = []
  step, restored, _ = checkpoint.restore_latest(d, state(0), warn=warnings.append)
  assert step == 1 and len(warnings) == 1 and "round 2" in warnings[0]
  np.testing.assert_array_equal(np.asarray(restored["w"]), np.asarray(state(1)["w"]))


def test_a_checkpoint_of_another_layout_says_so(tmp_path):
  """A state slot renamed between versions (issue 40 moved cluster noise's) makes every
  checkpoint unreadable: the warning and the error say it is the layout, not damage."""
  d = str(tmp_path / "ckpt")
  checkpoint.save(d, 1, {"cluster_noise": _state(1)}, {"round": 1})
  warnings = []
  with pytest.raises(checkpoint.CheckpointError, match="layout differs from this version's"):
    checkpoint.restore_latest(d, {"aggregator": _state(0)}, warn=warnings.append)
  assert len(warnings) == 1 and "its state's layout is not this run's" in warnings[0]
