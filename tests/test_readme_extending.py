"""The docs' Extending page runs as written: its python blocks are executed in order
(a term and an aggregator registered at run time, one short run)."""

from fedjax_dp.recipes import from_config
from tests.doc_pages import blocks
from tests.helpers import registries_restored

PAGE = "docs/how-to/extend.md"


def extending_blocks() -> list[str]:
  return [body for _, body in blocks("python", PAGE)]


def test_readme_extending_snippets_run(capsys):
  blocks = extending_blocks()
  assert len(blocks) == 7
  namespace = {}
  with registries_restored():   # other tests in this process read the registries
    for block in blocks:
      exec(compile(block, PAGE, "exec"), namespace)
    decay = namespace["decay_cfg"]   # a key the block registered, read into its term
    assert decay.weight_decay_lam == 0.01 and decay.to_dict()["weight_decay_lam"] == 0.01
    assert from_config(decay).terms[0].stage.hparams == {"lam": 0.01}
  stats = namespace["stats"]
  assert stats.flagged.shape == (2,)
  assert int(namespace["state"].round) == 2
  assert "weight_decay" in namespace["cfg"].algorithm
  assert namespace["blobs_cfg"].dataset == "blobs"   # a registered dataset
  assert namespace["blobs"].x_train.shape == (500, 6) and len(namespace["parts"]) == 5


def test_readme_server_stage_snippet_keeps_its_average():
  import jax.numpy as jnp
  import numpy as np
  from fedjax_dp.training.server_stages import RoundContext
  namespace = {}
  block = next(b for b in extending_blocks() if "released_average" in b)
  exec(compile(block, PAGE, "exec"), namespace)
  chain = namespace["chain"]
  params = {"w": jnp.zeros((2, 2)), "b": jnp.zeros((2,))}
  state = chain.init(params, 6)
  assert set(state) == {"released_average", "public_update"}
  delta = {"w": jnp.ones((2, 2)), "b": jnp.full((2,), 2.0)}
  ctx = RoundContext(None, {}, None, None, None, None, True)
  for _ in range(2):
    out, state, metrics = chain.update(delta, state, ctx)
  assert set(metrics) == {"released_average"}
  np.testing.assert_allclose(metrics["released_average"]["norm"],
                             np.linalg.norm(np.asarray(state["released_average"])), rtol=1e-6)
  flat = np.array([2.0, 2.0, 1.0, 1.0, 1.0, 1.0], np.float32)   # ravel order: b, then w
  np.testing.assert_allclose(state["released_average"], (1 - 0.9 ** 2) * flat, rtol=1e-6)
  np.testing.assert_array_equal(state["public_update"], flat)
  assert out is delta
