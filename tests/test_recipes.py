"""Recipes: every named recipe builds, validates and runs; a recipe is its flat config
bit for bit; combination rules fire from stage properties; from_config / to_config
round-trip every config we ship."""

import dataclasses
import glob
import json
import os
import re
import shlex

import jax
import numpy as np
import pytest

import fedjax_dp
from fedjax_dp import api, recipes
from fedjax_dp.compression import pipeline
from fedjax_dp.algorithms import LocalTerm
from fedjax_dp.algorithms import registry as term_registry
from fedjax_dp.config import Config
from fedjax_dp import load_config, make_config
from fedjax_dp.errors import ConfigError
from fedjax_dp.models import make_model
from fedjax_dp.recipes import stages as st
from fedjax_dp.recipes.flat import build_stage
from fedjax_dp.robust import Aggregator, metrics
from tests.helpers import objective_of, registries_restored
from fedjax_dp.robust import registry as rule_registry
from fedjax_dp.core.build import build_simulation
from fedjax_dp.recipes.plan import plan_run
from fedjax_dp.core.simulation import make_mesh
from fedjax_dp.placement.store import build_store
from fedjax_dp.data.tabular import TIERS
from tests.helpers import make_test_runs, toy_problem
from tests.test_config import PROTOCOL_SETS
from tests.test_golden import CONFIGS as GOLDEN_CONFIGS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = (7, 12, 3, 9, 5, 8)
TIERS_OF_FEATURES = np.array([TIERS.index(t) for t in ("high", "high", "low", "public",
                                                       "metadata", "low")])
# the set-up every run here shares (toy_simulation's)
SETUP = dict(num_clients=6, clients_per_round=6, hidden=[5], batch_size=4, local_epochs=2,
             lr=0.1, momentum=0.5, rounds=2)

# each named recipe, built in Python, and the flat config keys a user writes for it
NAMED = {
    "fedavg": (recipes.fedavg(), {}),
    "fedavgm": (recipes.fedavgm(server_momentum=0.8), dict(algorithm="fedavgm",
                                                           server_momentum=0.8)),
    "fedadam": (recipes.fedadam(server_lr=0.05), dict(algorithm="fedadam", server_lr=0.05)),
    "fedprox": (recipes.fedprox(mu=0.1), dict(algorithm="fedprox", prox_mu=0.1)),
    "scaffold": (recipes.scaffold(), dict(algorithm="scaffold")),
    "moon": (recipes.moon(mu=0.5, tau=0.2), dict(algorithm="moon", moon_mu=0.5, moon_tau=0.2)),
    "fedadmm": (recipes.fedadmm(rho=0.5), dict(algorithm="fedadmm", admm_rho=0.5)),
    "feddyn": (recipes.feddyn(alpha=0.1), dict(algorithm="feddyn", feddyn_alpha=0.1)),
    "contrastive": (recipes.contrastive(form="moon_params", tau=0.3),
                    dict(algorithm="contrastive", contrastive_form="moon_params",
                         contrastive_tau=0.3)),
    "topksdp": (recipes.topksdp(s_local=0.5, s_global=0.5, final_clip_l2=0.1,
                                kept_noise="multiplier", kept_noise_multiplier=1.0),
                dict(algorithm="topksdp", s_local=0.5, s_global=0.5, final_clip_l2=0.1,
                     kept_noise="multiplier", kept_noise_multiplier=1.0)),
    "solo": (recipes.solo(), dict(algorithm="solo")),
    "dp_fedavg": (recipes.dp_fedavg(noise_multiplier=0.8, clip_norm=0.5, adaptive_clipping=True),
                  dict(dp="central", noise_multiplier=0.8, clip_norm=0.5,
                       adaptive_clipping=True)),
    "ldp_fedavg": (recipes.ldp_fedavg(noise_multiplier=1.5, aggregator="trimmed_mean",
                                      trim_fraction=0.2),
                   dict(dp="local", noise_multiplier=1.5, aggregator="trimmed_mean",
                        trim_fraction=0.2)),
    "dynamic_dp": (recipes.dynamic_dp(target_epsilon=8.0, tier_source="given"),
                   dict(dp="central", target_epsilon=8.0, clip_norm=0.1, clip_parts="tiers",
                        noise_schedule="convergence", convergence_measure="norm_diff")),
    "dp_ftrl": (recipes.dp_ftrl("blt", noise_multiplier=1.5), dict(dp="blt", noise_multiplier=1.5)),
}


def _simulate(cfg):
  x, y, parts = toy_problem(sizes=SIZES)
  model = make_model(cfg.model, x.shape[1:], 3, cfg.hidden)
  store = build_store(x, y, parts, pad_to_multiple=cfg.batch_size)
  tiers = TIERS_OF_FEATURES if cfg.clip_parts == "tiers" else None
  return build_simulation(plan_run(cfg, model, tiers), model, store, make_mesh(1))


def _leaves(tree):
  return [np.asarray(a) for a in jax.tree.leaves(tree)]


def test_fedadmm_recipe_names_its_upload():
  recipe = recipes.fedadmm(rho=0.5, upload="change")
  recipe.validate()
  assert recipe.to_config(**SETUP) == make_config(
      {**SETUP, "algorithm": "fedadmm", "admm_rho": 0.5, "admm_upload": "change"})


def test_every_named_recipe_is_listed_here():
  assert set(NAMED) == set(recipes.NAMED)
  assert fedjax_dp.recipes.fedavg is recipes.fedavg   # a public name of the package


# `make test` keeps one case of each code path; the others run in `make test-slow` (CI runs both)
@pytest.mark.parametrize("name", make_test_runs(sorted(NAMED), {
    "fedavg", "scaffold", "topksdp", "dp_fedavg", "ldp_fedavg", "solo"}))
def test_named_recipe_runs_as_its_flat_config_bit_for_bit(name):
  """The recipe's config is the one a user writes, and two rounds of it give the
  flat config's state and statistics bit for bit (the flat path: make_config)."""
  recipe, flat_keys = NAMED[name]
  recipe.validate()
  cfg = recipe.to_config(**SETUP)
  assert cfg == make_config({**SETUP, **flat_keys})
  sim = _simulate(cfg)
  state, stats = sim.run_rounds(sim.init_state(), 2)
  assert int(state.round) == 2
  assert all(np.isfinite(a).all() for a in _leaves(state.params))
  if name in ("fedavg", "topksdp", "dp_fedavg", "ldp_fedavg"):   # a few, at a compile each
    ref = _simulate(make_config({**SETUP, **flat_keys}))
    ref_state, ref_stats = ref.run_rounds(ref.init_state(), 2)
    for a, b in zip(_leaves((state, stats)), _leaves((ref_state, ref_stats))):
      np.testing.assert_array_equal(a, b)


def test_recipe_resolves_to_the_stages_the_flat_path_builds():
  """Objective (terms + numbers), aggregation rule and its numbers, server optimizer
  and stage layout agree with the pre-recipe factories on every named recipe."""
  from fedjax_dp import robust
  from fedjax_dp.algorithms import parse_algorithm
  for name, (recipe, flat_keys) in NAMED.items():
    cfg = make_config({**SETUP, **flat_keys})
    assert recipe.objective(momentum=cfg.momentum) == objective_of(
        parse_algorithm(cfg.algorithm)[0], cfg), name
    assert recipe.rule == robust.get_aggregator(cfg.aggregator, **recipe.rule_hparams())
    assert recipe.rule_hparams() == dict(build_stage("aggregator", cfg.aggregator, cfg).hparams)
    assert recipe.server_optimizer.stage == recipes.flat.server_optimizer_name(cfg)
    assert recipes.base.outline(recipe) == recipes.base.outline(recipes.from_config(cfg))


def _readme_commands():
  """`fedjax-dp run` lines of the README and the docs (continuations joined) that name a
  whole config."""
  from tests.doc_pages import all_text
  text = all_text().replace("\\\n", " ")
  for line in text.splitlines():
    if not re.match(r"\s*(\$ )?(\.venv/bin/)?fedjax-dp run ", line) or "..." in line:
      continue
    words = shlex.split(line.split("#")[0])
    path = next((words[i + 1] for i, w in enumerate(words) if w == "--config"), None)
    sets, taking = [], False   # one --set takes every KEY=VALUE up to the next flag
    for w in words:
      taking = w == "--set" or (taking and not w.startswith("--"))
      if taking and w != "--set":
        sets.append(w)
    yield (os.path.join(ROOT, path) if path else None), sets


def _shipped_configs():
  for name, overrides in GOLDEN_CONFIGS.items():
    yield f"golden:{name}", make_config(dict(SETUP, **overrides))
  from fedjax_dp.sweeps import load_sweep
  from tests.helpers import is_sweep_file
  for path in sorted(glob.glob(os.path.join(ROOT, "experiments", "**", "*.yaml"),
                               recursive=True)):
    if is_sweep_file(path):
      for cell in load_sweep(path).cells():
        yield f"{os.path.relpath(path, ROOT)}: {cell.name}", cell.cfg
      continue
    yield os.path.relpath(path, ROOT), load_config(
        path, PROTOCOL_SETS.get(os.path.relpath(path, os.path.join(ROOT, "experiments")), []))
  for i, (path, sets) in enumerate(_readme_commands()):
    try:
      yield f"README command {i}", load_config(path, sets)
    except ConfigError:   # the README's example of a refused value
      assert sets == ["alpha=-1"]
  dynamic = os.path.join(ROOT, "experiments", "dynamic_dp", "base.yaml")
  yield "dynamic_dp full", load_config(dynamic, [
      "clip_parts=tiers", "tier_source=analyzer", "noise_schedule=convergence",
      "convergence_measure=norm_diff", "dp=central", "target_epsilon=1.9"])
  # keys no stage reads (prox_mu under fedavg, a schedule's window without DP) come back too
  # (a saved run's config from before such keys were refused: refuse_unread=False)
  yield "unused keys", make_config({"prox_mu": 0.3, "convergence_window": 4, "delta": 1e-6,
                                    "index_selection": "random_k"}, refuse_unread=False)


def test_from_config_then_to_config_is_the_same_config():
  seen = 0
  with registries_restored():   # a README command lists a plugin (Extending)
    for where, cfg in _shipped_configs():
      setup = {k: getattr(cfg, k) for k in recipes.SETUP_KEYS}
      again = recipes.from_config(cfg).to_config(**setup)
      assert again == cfg, where
      seen += 1
  assert seen > len(GOLDEN_CONFIGS) + 5


def test_config_keys_are_recipe_or_setup_keys():
  fields = {f.name for f in dataclasses.fields(Config)} - {"plugin_values"}
  assert set(recipes.RECIPE_KEYS) | recipes.SETUP_KEYS == fields
  assert not set(recipes.RECIPE_KEYS) & recipes.SETUP_KEYS


@pytest.fixture
def registries():
  """Term and rule registries restored after the test (other tests read them)."""
  saved = [dict(r) for r in (term_registry.TERMS, term_registry.ALGORITHMS,
                             rule_registry.AGGREGATORS)]
  yield
  for r, before in zip((term_registry.TERMS, term_registry.ALGORITHMS,
                        rule_registry.AGGREGATORS), saved):
    r.clear()
    r.update(before)


def test_a_new_non_linear_rule_is_refused_with_central_dp(registries):
  """From its `linear` property alone: nothing in config.py or recipes names it."""
  def first(u, mask, weights, state, hp):
    return u[0], state, metrics()
  rule_registry.register_aggregator(Aggregator(name="first_upload", aggregate=first))
  want = "config key 'aggregator' = 'first_upload' with dp 'central': the server noise"
  with pytest.raises(ConfigError, match=want):
    make_config({"aggregator": "first_upload", "dp": "central", "noise_multiplier": 1.0})
  recipe = recipes.compose("mine", st.aggregator("first_upload"),
                           st.central_dp(noise_multiplier=1.0))
  with pytest.raises(ConfigError, match=want):
    recipe.validate()
  make_config({"aggregator": "first_upload", "dp": "local", "noise_multiplier": 1.0})


def test_a_new_term_outside_the_guarantee_is_refused_with_dp(registries):
  term_registry.register_term(LocalTerm(name="leaky", outside_dp="it sends its gradients"))
  with pytest.raises(ConfigError, match="'algorithm' = 'leaky' with dp 'local': it sends"):
    make_config({"algorithm": "leaky", "dp": "local", "noise_multiplier": 1.0})
  make_config({"algorithm": "leaky"})


def test_stage_needs_are_read_from_properties():
  # a user's client stage that acts on sent coordinates, with no top-k before it
  stage = pipeline.clip_l2(1.0)._replace(name="mine", needs_sparsifier=True)
  recipe = recipes.compose("mine", ("upload", recipes.Choice(stage)))
  with pytest.raises(ConfigError, match="stage 'mine' acts on the sent coordinates"):
    recipe.validate()
  # ... and a stage the config has no key for is refused by to_config, not dropped
  plain = recipes.compose("mine", ("upload", recipes.Choice(stage._replace(
      needs_sparsifier=False))))
  with pytest.raises(ConfigError, match="a stage without config keys must be registered"):
    plain.to_config()


@pytest.mark.parametrize("recipe,fragment", [
    (recipes.topksdp(kept_noise="multiplier", kept_noise_multiplier=1.0),
     "needs final_clip_l2, coordinate_clip or update_clip_l2"),
    (recipes.compose("x", st.term("scaffold"), st.local_dp(noise_multiplier=1.0)),
     "SCAFFOLD's control variates are not privatized"),
    (recipes.compose("x", *st.upload(s_local=0.5), st.local_dp(noise_multiplier=1.0)),
     "'index_selection' = 'topk' with dp 'local' and s_local 0.5"),
    (recipes.compose("x", st.aggregator("median"), st.shuffle()),
     "'aggregator' = 'median' with shuffle 'layerwise'"),
    (recipes.compose("x", st.adaptive_clipping(), st.local_dp(noise_multiplier=1.0)),
     "'adaptive_clipping' = true: needs dp 'central' (dp is 'local')"),
    (recipes.compose("x", st.noise_schedule("convergence")),
     "'noise_schedule' = 'convergence' with dp 'none'"),
    (recipes.compose("x", st.cluster_noise()),
     "config key 'cluster_noise' = 'equalize': per-cluster noise needs dp 'local' (a "
     "mechanism that scales each client's noise and charges it; dp is 'none')"),
    (recipes.compose("x", st.allocated_budgets(), st.central_dp(noise_multiplier=1.0)),
     "per-client budgets need dp 'local' and target_epsilon"),
    (recipes.compose("x", st.public_update()), "'index_selection' = 'public_topk': needs s_local"),
    (recipes.compose("x", *st.upload(final_clip_l2=1.0)), "'final_clip_l2' clips the sent"),
])
def test_recipes_are_refused_with_the_configs_messages(recipe, fragment):
  with pytest.raises(ConfigError) as e:
    recipe.validate()
  assert fragment in str(e.value) and "\n" not in str(e.value)


def test_overrides_may_set_up_a_recipe_but_not_contradict_it():
  cfg = api.recipe_config(recipes.fedprox(mu=0.1), num_clients=8, clients_per_round=4,
                          rounds=3, prox_mu=0.1)
  assert (cfg.algorithm, cfg.prox_mu, cfg.num_clients, cfg.rounds) == ("fedprox", 0.1, 8, 3)
  with pytest.raises(ConfigError, match="'algorithm' = 'scaffold' contradicts recipe 'fedprox'"):
    api.recipe_config(recipes.fedprox(mu=0.1), algorithm="scaffold")
  with pytest.raises(ConfigError, match="'dp' = 'central' contradicts recipe 'fedavg'"):
    fedjax_dp.run(recipes.fedavg(), out="unused", dp="central", noise_multiplier=1.0)


def test_recipe_runs_through_the_python_api():
  sim = fedjax_dp.simulate(recipes.fedadam(server_lr=0.05), dataset="digits", num_clients=4,
                           clients_per_round=4, hidden=[8], batch_size=32, rounds=2)
  assert (sim.cfg.algorithm, sim.cfg.server_lr) == ("fedadam", 0.05)
  state, _ = sim.run_rounds(sim.init_state(), 2)
  assert int(state.round) == 2


def test_readme_recipes_example_runs(capsys):
  from tests.doc_pages import text
  page = "docs/reference/python-api.md"
  section = text(page).split("## Recipes", 1)[1].split("\n## ", 1)[0]
  (block,) = re.findall(r"```python\n(.*?)```", section, re.S)
  namespace = {}
  exec(compile(block, page, "exec"), namespace)
  assert int(namespace["state"].round) == 5
  assert capsys.readouterr().out.splitlines()[-2:] == ["central 1.0 True", "True"]


def test_an_auto_draw_follows_the_whole_recipe():
  """kept_noise_draw 'auto': the aggregate's noise drawn by the server only where the
  recipe has no DP mechanism and the weighted mean, as from_config resolves it."""
  kept = dict(s_local=0.5, index_selection="random_k", final_clip_l2=0.1,
              kept_noise="multiplier", kept_noise_multiplier=1.0)
  plain = recipes.compose("x", st.upload(**kept)).validate()
  private = recipes.compose("x", st.upload(**kept), st.local_dp(noise_multiplier=1.0)).validate()
  robust_rule = recipes.compose("x", st.upload(**kept), st.aggregator("median")).validate()
  owes = lambda r: any(c.stage.owes_noise for c in r.upload)
  assert owes(plain) and not owes(private) and not owes(robust_rule)
  assert owes(recipes.from_config(plain.to_config()))
  assert not owes(recipes.from_config(private.to_config()))


def test_a_recipe_round_trips_as_names_and_arguments():
  """recipes.to_dict -> JSON -> from_dict gives the same stages, numbers and run config,
  for every named recipe and every shipped config's recipe."""
  seen = 0
  with registries_restored():   # a README command lists a plugin
    named = [(name, make()) for name, make in recipes.NAMED.items()]
    shipped = [(where, recipes.from_config(cfg)) for where, cfg in _shipped_configs()]
    for where, recipe in named + shipped:
      data = json.loads(json.dumps(recipes.to_dict(recipe)))
      back = recipes.from_dict(data)
      assert recipes.to_dict(back) == data, where
      assert recipes.base.outline(back) == recipes.base.outline(recipe), where
      assert back.config_values() == recipe.config_values(), where
      assert recipes.base.numbers(back) == recipes.base.numbers(recipe), where
      seen += 1
  assert seen > len(recipes.NAMED) + len(GOLDEN_CONFIGS)


def test_from_dict_refuses_other_data_in_one_line():
  data = recipes.to_dict(recipes.fedprox(mu=0.1))
  with pytest.raises(ValueError, match="expected recipes.to_dict's"):
    recipes.from_dict({**data, "format": 2})
  renamed = json.loads(json.dumps(data))
  renamed["stages"][0]["stage"] = "fedproxx"   # a stage its arguments do not build
  with pytest.raises(ValueError, match="are not what their names and arguments build"):
    recipes.from_dict(renamed)
  clash = json.loads(json.dumps(data))
  clash["stages"].append({"slot": "terms", "stage": "fedprox", "args": {"prox_mu": 0.5}})
  with pytest.raises(ValueError, match="'prox_mu' is 0.1 for one stage and 0.5"):
    recipes.from_dict(clash)
  with pytest.raises(ValueError, match="expected recipes.to_dict's"):
    recipes.from_dict({k: v for k, v in data.items() if k != "stages"})
  private = recipes.to_dict(recipes.dp_fedavg(noise_multiplier=1.0))
  with pytest.raises(ValueError, match="are not what their names and arguments build"):
    recipes.from_dict({**private, "unused": {"noise_multiplier": 0.5}})   # not unused
  moved = json.loads(json.dumps(data))   # prox_mu under the server optimizer's stage
  moved["stages"][0]["args"] = {}
  moved["stages"][1]["args"]["prox_mu"] = 0.1
  with pytest.raises(ValueError, match="are not what their names and arguments build"):
    recipes.from_dict(moved)
