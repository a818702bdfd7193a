"""The round's one stage protocol (fedjax_dp/stage.py, issue 40 item 3): every stage's
update(x, state, ctx) -> (x, state, metrics); a stage's metrics in
RoundStats.metrics[its name], summed over the cohort where it runs per client, and
published with what the stage declares (experiment/releases.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_dp
from fedjax_dp import stage
from fedjax_dp.compression import pipeline as pl
from fedjax_dp.core.build import build_simulation
from fedjax_dp.core.simulation import make_mesh
from fedjax_dp.experiment import releases
from fedjax_dp.models import make_model
from fedjax_dp.placement.store import build_store
from fedjax_dp.recipes import Choice
from fedjax_dp.recipes.plan import plan_run
from fedjax_dp.training import server_stages as ss
from tests.helpers import registries_restored, toy_problem


def counter(name="counter"):
  """A client stage that changes nothing and reports, per client, 1 and its
  example count."""
  def update(u, s, ctx):
    return u, s, {"n": jnp.int32(1), "examples": ctx.num_examples.astype(jnp.float32)}
  return pl.ClientStage(lambda d: (), update, name=name,
                        declares=(("n", "public", "the cohort's size"),))


@pytest.mark.parametrize("devices, parallelism", [(1, "map"), (2, "vmap")])
def test_a_client_stages_metrics_are_summed_over_those_who_trained(devices, parallelism):
  x, y, parts = toy_problem(sizes=(7, 12, 3, 9, 5, 8))
  cfg = fedjax_dp.make_config(dict(num_clients=6, clients_per_round=4, sampling="poisson",
                                   max_cohort=6, hidden=[5], batch_size=4, local_epochs=1,
                                   devices=devices, client_parallelism=parallelism, rounds=5))
  model = make_model(cfg.model, x.shape[1:], 3, cfg.hidden)
  plan = plan_run(cfg, model)
  plan = plan._replace(recipe=plan.recipe.replace(upload=(Choice(counter()),)))
  sim = build_simulation(plan, model, build_store(x, y, parts, pad_to_multiple=4),
                         make_mesh(devices))
  _, stats = sim.run_rounds(sim.init_state(), 5)
  got = stats.metrics["counter"]
  # Poisson cohorts of several sizes, padded slots left out; one epoch: a client's
  # example visits are its examples
  assert len(set(np.asarray(stats.participants).tolist())) > 1
  np.testing.assert_array_equal(got["n"], stats.participants)
  np.testing.assert_array_equal(got["examples"], stats.examples)
  assert got["n"].dtype == jnp.int32 and got["examples"].dtype == jnp.float32


def test_a_stage_metric_that_no_stage_of_the_run_declares_is_not_covered():
  cfg = fedjax_dp.make_config({})
  found = releases.declaration("metrics.jsonl:counter.n", cfg)
  assert found.status == "not covered" and found.says == releases.UNDECLARED_STAGE_METRIC
  assert any("counter.n" in line for line in releases.not_accounted(
      fedjax_dp.make_config({"dp": "central", "noise_multiplier": 1.0}),
      ["metrics.jsonl:counter.n"]))


def test_a_declared_metric_keeps_its_status_in_every_table():
  """A rule's metric named like a final table's column ('norm_sd') keeps its own
  declaration in results.csv, and final.csv's statistics of each follow their metric."""
  from fedjax_dp.robust import Aggregator, metrics, register_aggregator

  def rule(u, mask, weights, state, hp):
    return u[0], state, metrics()
  with registries_restored():
    register_aggregator(lambda: Aggregator(
        name="norms", aggregate=rule,
        declares=(("norm", "public", "a public number"),
                  ("norm_sd", "not covered", "from the unnoised uploads"))))
    cfg = fedjax_dp.make_config({"aggregator": "norms"})
    status = lambda name: releases.declaration(name, cfg).status
    assert status("metrics.jsonl:aggregator.norm") == "public"
    assert status("metrics.jsonl:aggregator.norm_sd") == "not covered"
    assert status("sweep:results.csv:aggregator.norm_sd") == "not covered"
    assert status("sweep:results.csv:aggregator.norm") == "public"
    assert status("sweep:final.csv:aggregator.norm_sd_mean") == "not covered"
    assert status("sweep:final.csv:aggregator.norm_mean") == "public"
    assert status("sweep:final.csv:aggregator.norm_sd") == "not covered"


@pytest.mark.parametrize("value, message", [
    ([jnp.int32(1), jnp.int32(2)], "is list"), ({"a": jnp.int32(1)}, "is dict"),
    ("text", "is str"), (jnp.zeros(2), r"is \(2,\)")])
def test_a_metric_that_is_not_a_numeric_scalar_is_one_line(value, message):
  with pytest.raises(TypeError, match=message) as e:
    stage.check_metrics("s", {"m": value})
  assert "\n" not in str(e.value)
  with pytest.raises(TypeError, match="without a dot"):
    stage.check_metrics("s", {"a.b": jnp.int32(1)})
  assert stage.check_metrics("s", {"a": 1, "b": jnp.float32(0.5), "c": jnp.bool_(True)})


def _ctx():
  return pl.StageContext(jax.random.PRNGKey(0), jnp.int32(5), jnp.float32(0.1), jnp.zeros(3))


def test_an_update_of_another_shape_names_its_stage():
  old = pl.ClientStage(lambda d: (), lambda u, s, ctx: (u, s), name="old")
  with pytest.raises(TypeError, match="stage 'old': update returned 2 values"):
    pl.chain(old).update(pl.Upload(jnp.zeros(3), jnp.ones(3, bool)), ((),), _ctx())


def test_a_chain_keeps_each_reporting_stage_under_a_name_of_its_own():
  up, ctx = pl.Upload(jnp.zeros(3), jnp.ones(3, bool)), _ctx()
  _, _, m = pl.chain(counter("a"), counter("b")).update(up, ((), ()), ctx)
  assert set(m) == {"a", "b"}
  for chain in (pl.chain(counter("a"), counter("a")), pl.chain(counter(""))):
    with pytest.raises(ValueError, match="needs a name of its own"):
      chain.update(up, ((), ()), ctx)
  silent = pl.clip_l2(1.0)._replace(name="")   # reports nothing: no name needed
  pl.chain(silent, silent).update(up, ((), ()), ctx)
  with pytest.raises(ValueError, match="each metric once"):
    pl.chain(counter()._replace(declares=(("n", "public", "x"), ("n", "public", "y"))))
  same = ss.ServerStage("s", lambda p, d: (), lambda x, s, c: (x, s, {}))
  with pytest.raises(ValueError, match="needs a name of its own"):
    ss.chain(same, same)
