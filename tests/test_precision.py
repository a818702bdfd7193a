"""Matrix-product precision (config key matmul_precision, kernels' EXACT).

On an H100, JAX's default ran float32 products as TF32 (its measured "fp32" matmul
peak was 378 TFLOP/s): the weighted sum of clipped updates was off by 3e-4, Krum's
distances by 4e-4 (BENCHMARKS.md, GPU). The round is therefore traced at float32
unless the config asks for tensorfloat32, and the aggregation kernels pin float32
whatever the config says. These tests read the precision of every product in the
lowered programs (StableHLO names it on each dot_general), which XLA:CPU shows as
well as a GPU would.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.kernels import robust_aggregation as ra
from fedjax_dp.kernels import weighted_mean
from tests.helpers import flat, keyed_state, toy_problem, toy_simulation

_DOT = re.compile(r"stablehlo\.dot_general[^\n]*?precision = \[(\w+), (\w+)\]")


def precisions(text: str) -> list[str]:
  """The precision of every dot_general in a lowered program's text (one per operand
  pair, both operands the same here)."""
  found = _DOT.findall(text)
  assert found and len(found) == text.count("stablehlo.dot_general"), text.count("dot_general")
  return [a for a, b in found]


def round_text(sim) -> str:
  return sim.run_chunk.lower(sim.init_state(), sim.store, sim.hparams, 1).as_text()


@pytest.fixture(scope="module")
def problem():
  return toy_problem(sizes=(7, 12, 3, 9))


def test_the_round_and_evaluation_are_float32_by_default(problem):
  """Even where the surrounding default is TF32 (JAX's on a GPU; the tests set
  float32 globally, conftest.py), the simulation's own programs are float32."""
  with jax.default_matmul_precision("tensorfloat32"):
    sim = toy_simulation(*problem)
    assert set(precisions(round_text(sim))) == {"HIGHEST"}
    x = jnp.zeros((1, 4, problem[0].shape[1]))
    text = jax.jit(sim.evaluate).lower(sim.init_state().params, x,
                                       jnp.zeros((1, 4), jnp.int32),
                                       jnp.ones((1, 4), bool)).as_text()
    assert set(precisions(text)) == {"HIGHEST"}
    # and an unannotated product here is what the context says: the check can fail
    text = jax.jit(lambda a: a @ a).lower(jnp.ones((2, 2))).as_text()
    assert precisions(text) == ["HIGH"]


def test_tensorfloat32_relaxes_training_but_not_aggregation(problem):
  """Local training's products are HIGH (TF32 on a GPU); Krum's distances between
  the uploads stay HIGHEST, and so do the weighted sums of the stacked uploads."""
  sim = toy_simulation(*problem, matmul_precision="tensorfloat32", client_parallelism="vmap")
  assert set(precisions(round_text(sim))) == {"HIGH"}   # the fused sum is additions
  sim = toy_simulation(*problem, matmul_precision="tensorfloat32", aggregator="krum")
  found = precisions(round_text(sim))
  assert "HIGH" in found and "HIGHEST" in found, found
  # the kernels alone, under the same setting
  w, a = jnp.ones(3), jnp.ones((3, 5))
  with jax.default_matmul_precision("tensorfloat32"):
    text = jax.jit(weighted_mean.weighted_sum_tensordot).lower(w, [a]).as_text()
    assert precisions(text) == ["HIGHEST"]
    text = jax.jit(ra.pairwise_sq_distances).lower(a).as_text()
    assert precisions(text) == ["HIGHEST"]


def test_on_cpu_the_two_settings_give_the_same_numbers(problem):
  """XLA:CPU has no reduced-precision path: the README's "same as float32 on CPU"."""
  out = []
  for p in ("float32", "tensorfloat32"):
    sim = toy_simulation(*problem, matmul_precision=p)
    out.append(flat(sim.run_rounds(keyed_state(sim), 2, same_draws=True)[0].params))   # the same draws
  np.testing.assert_array_equal(out[0], out[1])
  assert np.any(out[0] != 0)


def test_an_unknown_precision_is_refused():
  from fedjax_dp import make_config
  from fedjax_dp.errors import ConfigError
  with pytest.raises(ConfigError, match="matmul_precision"):
    make_config({"matmul_precision": "bfloat16"})
