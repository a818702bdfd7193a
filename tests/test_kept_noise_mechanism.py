"""TopkSDP-FL's kept noise as a mechanism module (issue 40, item 4): the config's
mode strings (`dp`, `kept_noise`) are read only where the config becomes a
recipe, and a calibration registered from a plugin runs through the CLI with its
own noise and its own report, checked against dp-accounting."""

import ast
import json
import os

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import fedjax_dp
import fedjax_dp.errors
from fedjax_dp.models import Model
from fedjax_dp.cli import main
from fedjax_dp.compression import pipeline as pl
from fedjax_dp.privacy import mechanisms
from fedjax_dp.privacy.mechanisms import kept_noise
from fedjax_dp.recipes.kept_noise_check import check_kept_noise
from fedjax_dp.recipes import flat
from tests.helpers import registries_restored

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODES = ("dp", "kept_noise")
REGISTRIES = ("MECHANISMS", "KEPT_NOISE")   # a lookup by name is not a branch on it
STR_METHODS = frozenset(m for m in dir(str) if not m.startswith("_"))
# where the config is read as a recipe (recipes/flat.kept_noise_of, the names' check)
EDGE = ("fedjax_dp/recipes/flat.py", "fedjax_dp/recipes/config_checks.py")


def _is_mode(node) -> bool:
  """cfg.dp, v["kept_noise"], privacy.get("dp"), getattr(cfg, "kept_noise")."""
  if isinstance(node, ast.Attribute):
    return node.attr in MODES
  if isinstance(node, ast.Subscript):
    return isinstance(node.slice, ast.Constant) and node.slice.value in MODES
  if isinstance(node, ast.Call) and node.args and isinstance(node.args[-1], ast.Constant):
    named = (isinstance(node.func, ast.Attribute) and node.func.attr == "get") or (
        isinstance(node.func, ast.Name) and node.func.id == "getattr")
    return named and node.args[-1 if node.func.__class__ is ast.Name else 0].value in MODES
  return False


def _registry(node) -> bool:
  return (isinstance(node, ast.Name) and node.id in REGISTRIES) or (
      isinstance(node, ast.Attribute) and node.attr in REGISTRIES)


def mode_branches(source: str) -> list[int]:
  """Lines that branch on a mode string: compare it (either side, `is`, `in`), match
  on it, key a table other than the registries by it, or call its str methods."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Compare) and any(map(_is_mode, (node.left, *node.comparators))):
      found.append(node.lineno)
    elif isinstance(node, ast.Match) and _is_mode(node.subject):
      found.append(node.lineno)
    elif isinstance(node, ast.Subscript) and _is_mode(node.slice) and not _registry(node.value):
      found.append(node.lineno)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
        node.func.attr in STR_METHODS and _is_mode(node.func.value):
      found.append(node.lineno)
  return found


def _mode_branches_in_package() -> list[str]:
  found = []
  for folder, _, files in os.walk(os.path.join(ROOT, "fedjax_dp")):
    for name in files:
      path = os.path.join(folder, name)
      rel = os.path.relpath(path, ROOT)
      if name.endswith(".py") and rel not in EDGE:
        found += [f"{rel}:{line}" for line in mode_branches(open(path).read())]
  return found


def test_mode_strings_are_compared_only_at_the_edge():
  assert _mode_branches_in_package() == []


@pytest.mark.parametrize("source", [
    'if cfg.kept_noise == "paper": pass', "x = c.dp != 'none'",
    'if v["kept_noise"] != "none": pass', 'privacy.get("dp") != "none"',
    "if cfg.dp in ('central', 'local'): pass", '"paper" == cfg.kept_noise',
    'getattr(cfg, "kept_noise") == "paper"', 'x = cfg.kept_noise is None',
    "match cfg.dp:\n  case 'central': pass", "std = {'paper': 1}[cfg.kept_noise]",
    "cfg.dp.startswith('c')", "ok = (cfg.kept_noise\n      == 'paper')"])
def test_the_mode_scan_finds_a_branch(source):
  """Not vacuous: each spelling of a branch on the mode is found."""
  assert mode_branches(source)


@pytest.mark.parametrize("source", [
    "m = get_mechanism(cfg.dp)", "k = mechanisms.KEPT_NOISE.get(cfg.kept_noise)",
    "m = MECHANISMS[cfg.dp]", 'text = f"dp {cfg.dp!r}"'])
def test_the_mode_scan_lets_lookups_by_name_pass(source):
  assert not mode_branches(source)


TWICE = '''
from fedjax_dp.privacy.mechanisms import register_kept_noise
from fedjax_dp.privacy.mechanisms.kept_noise import KeptNoise


def _numbers(s, clip):   # passed to the round as data
  return {"std": 2 * s["kept_noise_multiplier"] * clip}


register_kept_noise(KeptNoise("twice", _numbers, lambda hp, s, k, lr, n: hp["std"], "2 z C",
                              reads=("kept_noise_multiplier", "ldp_delta")))
'''

RUN = {"dataset": "digits", "num_clients": 10, "clients_per_round": 5, "sampling": "fixed",
       "hidden": [16], "batch_size": 16, "lr": 0.05, "rounds": 3, "eval_every": 3,
       "devices": 1, "algorithm": "topksdp", "s_local": 0.9, "index_selection": "random_k",
       "final_clip_l2": 0.5, "kept_noise": "twice", "kept_noise_multiplier": 1.5,
       "ldp_delta": 1e-5}


@pytest.fixture
def twice(tmp_path):
  (tmp_path / "twice.py").write_text(TWICE)
  with registries_restored():
    yield str(tmp_path / "twice.py")


def test_a_registered_calibration_draws_its_own_noise(twice):
  """The recipe's kept-noise stage is the plugin's: N(0, (2 z C)^2) on the kept
  coordinates only (KS test), nothing elsewhere."""
  cfg = fedjax_dp.make_config({**RUN, "plugins": [twice], "kept_noise_draw": "client"})
  assert flat.kept_noise_of(cfg) is mechanisms.KEPT_NOISE["twice"]
  stage = fedjax_dp.recipes.from_config(cfg).client_pipeline()
  d = 20_000
  u = pl.Upload(jnp.zeros(d, jnp.float32), jnp.ones(d, bool))
  ctx = pl.StageContext(jax.random.PRNGKey(3), jnp.int32(50), jnp.float32(0.05), jnp.zeros(d))
  out, _, _ = stage.update(u, stage.init(d), ctx)
  values, sent = np.asarray(out.values), np.asarray(out.sent)
  assert sent.sum() == pl.keep_count(d, 0.9) and np.all(values[~sent] == 0)
  assert stats.kstest(values[sent] / (2 * 1.5 * 0.5), "norm").pvalue > 1e-3


def test_a_registered_calibration_runs_from_the_cli_with_its_epsilon(twice, tmp_path):
  """Its report: the std 2 z C_f, and the accountant's per-client epsilon of a
  Gaussian of multiplier std / (2 C_f) over every round, as dp-accounting composes it."""
  out = str(tmp_path / "run")
  sets = [f"{k}={json.dumps(v) if isinstance(v, list) else v}"
          for k, v in {**RUN, "plugins": [twice]}.items()]
  assert main(["run", "--no-progress", "--out", out, "--set", *sets]) == 0
  kept = json.load(open(os.path.join(out, "summary.json")))["privacy"]["kept_noise"]
  std = 2 * 1.5 * 0.5
  assert kept["noise_std"]["min_over_clients"] == pytest.approx(std)
  assert kept["noise_std"]["max_over_clients"] == pytest.approx(std)
  assert "papers_chain" not in kept and "size_leak" not in kept
  accountant = dp_accounting.rdp.RdpAccountant()
  accountant.compose(dp_accounting.GaussianDpEvent(std / (2 * 0.5)), RUN["rounds"])
  want = accountant.get_epsilon(1e-5)
  assert kept["accountant"]["epsilon"] == pytest.approx(want, rel=2e-2)


def test_an_unregistered_calibration_is_one_line(capsys, tmp_path):
  out = str(tmp_path / "run")
  assert main(["run", "--no-progress", "--out", out, "--set", "kept_noise=halved"]) == 2
  assert not os.path.exists(os.path.join(out, "summary.json"))
  err = capsys.readouterr().err.strip()
  assert err.count("\n") == 0
  assert "kept_noise' = 'halved'" in err and "none, paper, multiplier" in err


def test_register_kept_noise_refuses_none_and_a_taken_name():
  with registries_restored():
    taken = mechanisms.KEPT_NOISE["paper"]._replace(follows_lr=False)
    with pytest.raises(ValueError, match="already registered"):
      mechanisms.register_kept_noise(taken)
    with pytest.raises(ValueError, match="already registered"):
      mechanisms.register_kept_noise(taken._replace(name="none"))
    mechanisms.register_kept_noise(mechanisms.KEPT_NOISE["paper"])   # the same bundle again


OWN = {k: v for k, v in RUN.items() if k != "kept_noise_multiplier"}   # read by none of these


def _calibration(name, std, **properties):
  """A calibration of std(n, lr)."""
  return mechanisms.KeptNoise(name, lambda s, clip: {}, lambda hp, s, k, lr, n: std(n, lr),
                              "its std", **properties)


@pytest.mark.parametrize("calibration,message", [
    (_calibration("quiet", lambda n, lr: 2.0 / n), "depends on the client's size n_i"),
    # found by the audit of 010ae43: a dependence beyond a small probe grid
    (_calibration("floored", lambda n, lr: 10.0 / max(n, 10)), "depends on the client's size"),
    (_calibration("grow", lambda n, lr: 0.1 * n ** 0.5, reveals_size=True),
     "other than as 1 / n_i"),
    (_calibration("lrquiet", lambda n, lr: 10 * lr), "declare follows_lr=True"),
    (_calibration("lrfloor", lambda n, lr: min(1.0, lr / 0.005)), "declare follows_lr=True"),
    (_calibration("lrsquare", lambda n, lr: 10 * lr * lr, follows_lr=True),
     "other than in proportion"),
    (mechanisms.KeptNoise("peek", lambda s, clip: {}, lambda hp, s, k, lr, n:
                          s["kept_noise_multiplier"], reads=("kept_noise_multiplier",)),
     "its std reads setting 'kept_noise_multiplier'"),
])
def test_a_calibration_the_report_could_not_account_is_refused(calibration, message, tmp_path):
  """Found by audits of 8d64037 and 010ae43: the report takes a size-dependent std
  as 1 / n_i and an lr-dependent one as proportional to lr; a registered calibration
  that broke this would be reported with a smaller epsilon than it spends. Refused
  once the run's client sizes are known, before any round (exit 2, nothing run).
  (The round and the report evaluate the same std function, and std never sees a
  number a sweep changes as data, so they cannot disagree.)"""
  values = {**OWN, "kept_noise": calibration.name, "lr_schedule": "cosine", "lr_min": 0.0}
  with registries_restored():
    mechanisms.register_kept_noise(calibration)
    cfg = fedjax_dp.make_config(values)
    with pytest.raises(fedjax_dp.errors.ConfigError, match=message):
      check_kept_noise(cfg, [60] * 10)
    out = str(tmp_path / "run")
    sets = [f"{k}={json.dumps(v) if isinstance(v, list) else v}" for k, v in values.items()]
    assert main(["run", "--no-progress", "--out", out, "--set", *sets]) == 2
    assert not os.path.exists(os.path.join(out, "metrics.jsonl"))


def test_a_calibration_declared_as_it_is_is_accounted():
  with registries_restored():
    fair = _calibration("fair", lambda n, lr: 10 * lr / n, reveals_size=True, follows_lr=True)
    mechanisms.register_kept_noise(fair)
    assert kept_noise.problem(fair, {}, 1.0, [3, 60, 600], [0.05, 0.01]) is None
    check_kept_noise(fedjax_dp.make_config({**OWN, "kept_noise": "fair"}), [60] * 10)
    for built in ("paper", "multiplier"):
      kept = mechanisms.KEPT_NOISE[built]
      settings = {"ldp_epsilon": 3.0, "ldp_delta": 1e-5, "kept_noise_multiplier": 2.0}
      assert kept_noise.problem(kept, {k: settings[k] for k in kept.reads}, 0.5, [1, 60],
                                [0.1, 0.001]) is None


@pytest.mark.parametrize("reads,papers_chain,message", [
    (("ldp_eps",), False, "reads 'ldp_eps'"),
    (("ldp_delta",), True, "papers_chain")])
def test_register_kept_noise_checks_what_it_reads(reads, papers_chain, message):
  """Found by the audit of 010ae43: a misspelt read failed at the first config, and a
  papers_chain calibration that did not read ldp_epsilon could never be configured."""
  bad = mechanisms.KeptNoise("bad", lambda s, clip: {}, lambda hp, s, k, lr, n: 1.0,
                             papers_chain=papers_chain, reads=reads)
  with registries_restored():
    with pytest.raises(ValueError, match=message):
      mechanisms.register_kept_noise(bad)
    assert "bad" not in mechanisms.KEPT_NOISE


def test_the_data_settings_are_the_numeric_keys():
  """kept_noise.DATA_SETTINGS (std never sees them) are the kept-noise settings that
  recipes/hparams treats as data."""
  from fedjax_dp.recipes.hparams import NUMERIC_KEYS
  assert set(kept_noise.DATA_SETTINGS) == set(kept_noise.SETTINGS) & set(NUMERIC_KEYS)


def test_a_misspelt_calibration_in_a_python_recipe_is_refused():
  """Found by an audit of 8d64037: an unregistered name built no stage, so the recipe
  ran without kept noise."""
  with pytest.raises(fedjax_dp.errors.ConfigError, match="'kept_noise' = 'paperr'"):
    fedjax_dp.recipes.topksdp(final_clip_l2=0.5, kept_noise="paperr", ldp_epsilon=1.0,
                              index_selection="random_k")


@pytest.mark.parametrize("sets,key", [
    ({"kept_noise": "multiplier", "kept_noise_multiplier": 1.0, "ldp_epsilon": 3.0}, "ldp_epsilon"),
    ({"kept_noise": "paper", "ldp_epsilon": 3.0, "kept_noise_multiplier": 2.0},
     "kept_noise_multiplier")])
def test_a_key_the_calibration_does_not_read_is_refused(sets, key):
  base = {"algorithm": "topksdp", "s_local": 0.9, "final_clip_l2": 0.5}
  with pytest.raises(fedjax_dp.errors.ConfigError,
                     match=f"'{key}' = .* is read by nothing in this run: it is read with "
                           f"kept_noise '(paper|multiplier)'$"):
    fedjax_dp.make_config({**base, **sets})


def test_the_papers_chain_before_the_first_round():
  from fedjax_dp.experiment.reports.topksdp_privacy import topksdp_report
  cfg = fedjax_dp.make_config({"algorithm": "topksdp", "s_local": 0.9, "final_clip_l2": 0.5,
                               "kept_noise": "paper", "ldp_epsilon": 3.0})
  chain = topksdp_report(cfg, 1000, 0, [60] * 20)["papers_chain"]
  assert chain["epsilon"] == 0.0 and "no round ran" in chain["label"]


def test_recipe_data_saved_before_a_calibration_said_what_it_reads_loads(tmp_path):
  """Found by the audit of 010ae43: recipes.to_dict of a kept-noise recipe written
  before 010ae43 kept every kept-noise key (at its default where the calibration does
  not read it); it loads, and one that set such a key away from its default is
  refused naming it."""
  built = fedjax_dp.recipes.to_dict(fedjax_dp.recipes.from_config(fedjax_dp.make_config(
      {"algorithm": "topksdp", "s_local": 0.9, "final_clip_l2": 0.5, "kept_noise": "multiplier",
       "kept_noise_multiplier": 2.0, "index_selection": "random_k"})))
  original = json.loads(json.dumps(built))
  kept = next(s for s in built["stages"] if s["stage"] == "gaussian_on_kept")
  assert "ldp_epsilon" not in kept["args"]
  kept["args"]["ldp_epsilon"] = None   # as 8d64037 wrote it
  assert json.loads(json.dumps(fedjax_dp.recipes.to_dict(
      fedjax_dp.recipes.from_dict(built)))) == original
  kept["args"]["ldp_epsilon"] = 3.0
  with pytest.raises(ValueError, match="'ldp_epsilon' = 3.0 is read by no stage of it"):
    fedjax_dp.recipes.from_dict(built)


def test_a_recipe_builder_refuses_a_key_no_stage_reads():
  """Found by the audit of 010ae43: recipes.topksdp(..., ldp_epsilon=2.0) under the
  multiplier dropped ldp_epsilon, which make_config refuses."""
  with pytest.raises(fedjax_dp.errors.ConfigError, match="'ldp_epsilon' = 2.0 is read by no"):
    fedjax_dp.recipes.topksdp(final_clip_l2=0.5, kept_noise="multiplier",
                              kept_noise_multiplier=1.0, ldp_epsilon=2.0)
  with pytest.raises(fedjax_dp.errors.ConfigError, match="'index_selection' = 'random_k'"):
    fedjax_dp.recipes.stages.upload(index_selection="random_k")


def test_a_mechanism_and_a_calibration_declare_what_their_report_publishes():
  """Issue 40, item 4: a bundle declares the summary.json paths its report lines
  publish (Mechanism.releases, KeptNoise.releases), looked up before the registry's
  catch-all privacy.** (covered); the kept-noise section's statuses follow the
  calibration's properties."""
  from fedjax_dp.experiment import releases
  from fedjax_dp.stage import COVERED, NOT_COVERED, PUBLIC
  with registries_restored():
    local = mechanisms.MECHANISMS["local"]
    mechanisms.register_mechanism(local._replace(
        name="local_noted", releases=(("privacy.noted.*", NOT_COVERED, "a note quoting sizes"),)))
    cfg = fedjax_dp.make_config({"dp": "local_noted", "noise_multiplier": 1.0})
    assert releases.declaration("summary.json:privacy.noted.n", cfg).status == NOT_COVERED
    plain = fedjax_dp.make_config({"dp": "local", "noise_multiplier": 1.0})
    assert releases.declaration("summary.json:privacy.noted.n", plain).status == COVERED
    mechanisms.register_kept_noise(mechanisms.KEPT_NOISE["multiplier"]._replace(
        name="noted", releases=(("privacy.kept_noise.k", NOT_COVERED, "k, say"),)))
    noted = fedjax_dp.make_config({**RUN, "kept_noise": "noted"})
    assert releases.declaration("summary.json:privacy.kept_noise.k", noted).status == NOT_COVERED
  path = "summary.json:privacy.kept_noise.noise_std.min_over_clients"
  base = {"algorithm": "topksdp", "s_local": 0.9, "final_clip_l2": 0.5}
  paper = fedjax_dp.make_config({**base, "kept_noise": "paper", "ldp_epsilon": 3.0})
  multiplier = fedjax_dp.make_config({**base, "kept_noise": "multiplier",
                                      "kept_noise_multiplier": 1.0})
  assert releases.declaration(path, paper).status == NOT_COVERED
  assert releases.declaration(path, multiplier).status == PUBLIC
  assert releases.declaration("summary.json:privacy.kept_noise.k", multiplier).status == PUBLIC


def _floored(name, follows_lr=False):
  """std = max(z C, 0.05 C lr) (written to trace: max(a, b) = (a + b + |a - b|) / 2):
  constant in lr while z C is the larger."""
  def numbers(s, clip):
    return {"zc": s["kept_noise_multiplier"] * clip, "c": clip}

  def std(hp, s, k, lr, n):
    a, b = hp["zc"], 0.05 * hp["c"] * lr
    return (a + b + abs(a - b)) / 2
  return mechanisms.KeptNoise(name, numbers, std, "max(z C, 0.05 C lr)", follows_lr=follows_lr,
                              reads=("kept_noise_multiplier", "ldp_delta"))


def test_the_probe_uses_the_runs_kept_count():
  """Found by the audit of 392aef3: probed at k = 32 only, a std whose dependence on
  lr shows at the run's k (about 2x the epsilon reported) passed."""
  with registries_restored():
    mechanisms.register_kept_noise(mechanisms.KeptNoise(
        "bigk", lambda s, clip: {}, lambda hp, s, k, lr, n: max(1.0, k * lr / 500)))
    cfg = fedjax_dp.make_config({**OWN, "kept_noise": "bigk", "s_local": 0.5})
    check_kept_noise(cfg, [60] * 10)   # at k = 32 it looks constant
    with pytest.raises(fedjax_dp.errors.ConfigError, match="depends on the learning rate"):
      check_kept_noise(cfg, [60] * 10, model=Model(lambda key: {"w": jnp.zeros(40_000)},
                                                   lambda params, x: x, "flat"))


def test_with_hparams_checks_the_new_numbers_against_the_report():
  """Found by the audit of 392aef3: a sweep's replica (with_hparams) changed the std's
  numbers without the check: max(z C, 0.05 C lr) is constant in lr at z 1.5, not at
  z 0.001."""
  with registries_restored():
    mechanisms.register_kept_noise(_floored("floor"))
    values = {**OWN, "kept_noise": "floor", "kept_noise_multiplier": 1.5}
    sim = fedjax_dp.simulate("topksdp", **{k: v for k, v in values.items() if k != "algorithm"})
    sim.with_hparams(kept_noise_multiplier=2.0)
    with pytest.raises(fedjax_dp.errors.ConfigError, match="depends on the learning rate"):
      sim.with_hparams(kept_noise_multiplier=0.001)


def test_a_sweep_refuses_a_cell_before_any_runs():
  """Found by the audit of 392aef3: with the check at each program's set-up, a sweep
  ran its first cells before refusing a later one; the grid part needs no data."""
  from fedjax_dp.sweeps.spec import SweepSpec
  with registries_restored():
    mechanisms.register_kept_noise(_calibration("floored", lambda n, lr: 10.0 / max(n, 10)))
    spec = SweepSpec(base={k: v for k, v in OWN.items() if k != "kept_noise"},
                     variants=({"kept_noise": "multiplier", "kept_noise_multiplier": 1.0},
                               {"kept_noise": "floored"}))
    with pytest.raises(fedjax_dp.errors.ConfigError,
                       match="sweep cell 'kept_noise=floored.*depends on the client's size"):
      spec.cells()


def test_a_report_std_written_with_jnp_is_a_float():
  """Found by the audit of 392aef3: a std of jnp arithmetic reached summary.json as an
  array, and writing it failed after the last round."""
  kept = mechanisms.KeptNoise("jnp", lambda s, clip: {"c": clip},
                              lambda hp, s, k, lr, n: jnp.maximum(hp["c"], 0.0))
  assert type(kept_noise.report_std(kept, {}, 0.5, 10, 0.1, 60)) is float


@pytest.mark.parametrize("build", [
    lambda: fedjax_dp.recipes.topksdp(s_local=0.0, s_global=0.9, topk_kernel="approx"),
    lambda: fedjax_dp.recipes.topksdp(index_selection="public_topk", final_clip_l2=0.5,
                                      kept_noise="multiplier", kept_noise_multiplier=1.0)])
def test_topksdp_recipes_the_audit_found_refused_run(build):
  """Found by the audit of 392aef3: downlink top-k's kernel was refused as unread by the
  upload stages, and public_topk's recorder came before downlink top-k, the other
  way round from the config's recipe."""
  recipe = build()
  cfg = recipe.to_config(dataset="digits")
  assert fedjax_dp.recipes.from_dict(fedjax_dp.recipes.to_dict(recipe)) == \
      fedjax_dp.recipes.from_config(cfg).replace(name=recipe.name)
