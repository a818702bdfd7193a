"""The README's Extending section runs as written: its python blocks are executed
in order (a term and an aggregator registered at run time, one short run)."""

import os
import re

from fedjax_dp.algorithms import registry as term_registry
from fedjax_dp.data import registry as data_registry
from fedjax_dp.robust import registry as rule_registry

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def extending_blocks() -> list[str]:
  text = open(README).read()
  section = text.split("## Extending", 1)[1].split("\n## ", 1)[0]
  return re.findall(r"```python\n(.*?)```", section, re.S)


def test_readme_extending_snippets_run(capsys):
  blocks = extending_blocks()
  assert len(blocks) == 6
  namespace = {}
  registries = (term_registry.TERMS, term_registry.ALGORITHMS, rule_registry.AGGREGATORS,
                data_registry.DATASETS)
  saved = [dict(r) for r in registries]
  try:
    for block in blocks:
      exec(compile(block, README, "exec"), namespace)
  finally:   # the registries, in place, as they were (other tests in this process read them)
    for registry, before in zip(registries, saved):
      registry.clear()
      registry.update(before)
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
  exec(compile(block, README, "exec"), namespace)
  chain = namespace["chain"]
  params = {"w": jnp.zeros((2, 2)), "b": jnp.zeros((2,))}
  state = chain.init(params, 6)
  assert set(state) == {"released_average", "public_update"}
  delta = {"w": jnp.ones((2, 2)), "b": jnp.full((2,), 2.0)}
  ctx = RoundContext(None, {}, None, None, None, None, True, ())
  for _ in range(2):
    out, state = chain.update(delta, state, ctx)
  flat = np.array([2.0, 2.0, 1.0, 1.0, 1.0, 1.0], np.float32)   # ravel order: b, then w
  np.testing.assert_allclose(state["released_average"], (1 - 0.9 ** 2) * flat, rtol=1e-6)
  np.testing.assert_array_equal(state["public_update"], flat)
  assert out is delta
