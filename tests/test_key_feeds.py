"""Config keys feed stage constructors (issue 40, item 2): each key that is a number
of a local term or an aggregation rule names the constructor argument it becomes
(config/keys.py `feeds`), and recipes.from_config builds the stage from it."""

import inspect

import pytest

from fedjax_dp import make_config, recipes
from fedjax_dp.algorithms import TERMS, LocalTerm, register_term
from fedjax_dp.algorithms import registry as term_registry
from fedjax_dp.config.keys import KEYS
from fedjax_dp.errors import ConfigError
from fedjax_dp.recipes import stages as st
from fedjax_dp.recipes.flat import FEEDS
from fedjax_dp.compression import pipeline as pl
from fedjax_dp.training import server_stages
from fedjax_dp.robust import AGGREGATORS

REGISTRY = {"term": TERMS, "aggregator": AGGREGATORS}
# the upload pipeline's and the server's stages, built where their switch key is set
BUILT = {"upload": {"clip_per_coordinate": pl.clip_per_coordinate, "clip_l2": pl.clip_l2,
                    "topk": pl.topk_with_error_feedback, "clip_sent": pl.clip_sent},
         "server": {"downlink_topk": server_stages.downlink_topk_spec}}
# slots whose stage reads its keys as settings by name (SLOT:* or SLOT:STAGE)
SETTINGS = {"upload:gaussian_on_kept", "server:public_update", "term:*", "aggregator:*",
            "shuffle:*", "server_optimizer:*", "privacy:*", "planner:*", "adaptive_clip:*",
            "budgets:*"}


def _feeds(keys):
  return [(k, f) for k in keys for f in k.feeds if f not in SETTINGS]


@pytest.mark.parametrize("key,feed", _feeds(KEYS), ids=lambda x: getattr(x, "name", x))
def test_a_key_feeds_an_argument_whose_default_is_the_keys(key, feed):
  """A term's or rule's argument has the key's default (the stage exists whatever
  the key); a pipeline or server stage's argument exists (the stage is built only
  where its switch key is set)."""
  slot, _, target = feed.partition(":")
  stage, _, arg = target.partition(".")
  make = REGISTRY[slot][stage] if slot in REGISTRY else BUILT[slot][stage]
  params = inspect.signature(make).parameters
  assert arg in params, feed
  if slot in REGISTRY:
    assert params[arg].default == key.default, (feed, params[arg].default, key.default)


def test_every_feed_names_a_slot_and_every_recipe_key_feeds_one():
  """The keys that feed nothing are the set-up's (recipes.SETUP_KEYS); the others
  each feed a stage of a recipe slot."""
  slots = {"term", "aggregator", "upload", "server", "shuffle", "server_optimizer", "privacy",
           "planner", "adaptive_clip", "budgets"}
  assert {f.partition(":")[0] for k in KEYS for f in k.feeds} == slots
  assert {k.name for k in KEYS if k.feeds} == set(recipes.RECIPE_KEYS)
  assert recipes.SETUP_KEYS == {k.name for k in KEYS} - set(recipes.RECIPE_KEYS)


@pytest.mark.parametrize("values,stage,hparams", [
    ({"s_local": 0.75, "index_selection": "random_k", "error_feedback": False,
      "topk_kernel": "bisect", "final_clip_l2": 0.5}, "topk", {"final_clip": 0.5}),
    ({"coordinate_clip": 0.25}, "clip_per_coordinate", {"clip": 0.25}),
    ({"update_clip_l2": 2.0}, "clip_l2", {"clip": 2.0})])
def test_from_config_builds_the_pipelines_stages_from_their_rows(values, stage, hparams):
  """A pipeline stage built from the keys' rows is the one its constructor builds
  with the same numbers (the same properties and numbers)."""
  built = {c.stage.name: c for c in recipes.from_config(make_config(values)).upload}[stage]
  assert dict(built.stage.hparams) == hparams
  assert set(built.config) == {k.name for k in KEYS if any(
      f.startswith(f"upload:{stage}") for f in k.feeds)}
  if stage == "topk":
    want = pl.topk_with_error_feedback(0.75, "random_k", False, "bisect", 0.5)
    assert (built.stage.sparsifies, built.stage.private_positions, built.stage.bound) == (
        want.sparsifies, want.private_positions, want.bound)


@pytest.mark.parametrize("slot,name", [(s, n) for s in REGISTRY for n in REGISTRY[s]])
def test_every_argument_of_a_built_in_stage_has_a_key(slot, name):
  """No number of a built-in term or rule is out of the CLI's reach."""
  args = set(inspect.signature(REGISTRY[slot][name]).parameters)
  fed = {arg for _, arg in FEEDS.get((slot, name), ())}
  assert args == fed, (slot, name, args - fed)


def test_from_config_builds_each_stage_with_its_keys_values():
  cfg = make_config({"algorithm": "fedprox+scaffold", "prox_mu": 0.25, "aggregator": "multi_krum",
                     "byzantine_f": 1, "multi_krum_m": 3})
  recipe = recipes.from_config(cfg)
  assert dict(recipe.terms[0].stage.hparams) == {"mu": 0.25}
  assert recipe.rule_hparams() == {"f": 1, "m": 3}
  assert recipe.rule == AGGREGATORS["multi_krum"](f=1, m=3)


def test_a_number_no_key_feeds_is_refused_not_dropped():
  """A registered stage built with a number the config cannot spell would run at its
  constructor's default once the run is rebuilt from its config: refused."""
  def scaled_loss(inputs, hp):
    return 0.0 * hp["c"]

  def scaled(c: float = 1.0) -> LocalTerm:
    return LocalTerm(name="scaled_term", hparams={"c": c}, loss=scaled_loss)
  register_term(scaled)
  try:
    at_default = recipes.compose("scaled_term", ("terms", recipes.Choice(scaled(), {})), st.sgd())
    at_default.to_config(dataset="digits")   # the default: what the config rebuilds
    other = recipes.compose("scaled_term", ("terms", recipes.Choice(scaled(c=2.0), {})),
                            st.sgd())
    with pytest.raises(ConfigError, match="numbers .* are not what its config keys give"):
      other.to_config(dataset="digits")
  finally:
    del TERMS["scaled_term"], term_registry.ALGORITHMS["scaled_term"]


def test_a_constructor_without_defaults_is_refused_at_registration():
  from fedjax_dp.robust import Aggregator, register_aggregator

  def bounded(bound: float) -> Aggregator:   # no default: from_config could not build it
    return Aggregator(name="bounded_rule", aggregate=lambda *a: a)
  with pytest.raises(ValueError, match="no arguments, each number with a default"):
    register_aggregator(bounded)
  with pytest.raises(ValueError, match="no arguments, each number with a default"):
    register_term(lambda lam: LocalTerm(name="no_default_term", hparams={"lam": lam}))
  assert "bounded_rule" not in AGGREGATORS and "no_default_term" not in TERMS
