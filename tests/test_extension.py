"""One file to extend (issue 40, item 5): a local term, an aggregation rule and a
privacy mechanism, each from a temporary module named by the config's `plugins`,
through the CLI, a sweep (one compiled program across the mechanism's noise) and
fedjax_dp.run. The mechanism is a real one, the Laplace local mechanism of
experiments/extending/laplace_local.py, checked against its closed form, against
dp-accounting, and attacked: the differential method (the same keys with and
without its noise) and a pair of neighbouring reports."""

import json
import os
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

import fedjax_dp
from fedjax_dp.algorithms import registry as term_registry
from fedjax_dp.cli import main
from fedjax_dp.privacy import accounting, mechanisms
from fedjax_dp.robust import registry as rule_registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAPLACE = os.path.join(ROOT, "experiments", "extending", "laplace_local.py")
SMALL = {"dataset": "digits", "num_clients": 10, "clients_per_round": 5, "sampling": "fixed",
         "hidden": [16], "batch_size": 16, "lr": 0.05, "rounds": 4, "eval_every": 2,
         "devices": 1, "clip_norm": 1.0}

TERM_AND_RULE = '''
import jax.numpy as jnp
from fedjax_dp.algorithms import LocalTerm, register_term
from fedjax_dp.algorithms.base import dot
from fedjax_dp.kernels import robust_aggregation as ra
from fedjax_dp.robust import Aggregator, metrics, on_finite_uploads, register_aggregator


def _decay_loss(inputs, hp):
  return 0.5 * hp["lam"] * dot(inputs.params, inputs.params)


def ext_decay(lam: float = 0.01) -> LocalTerm:
  return LocalTerm(name="ext_decay", hparams={"lam": lam}, loss=_decay_loss)


def _bounded_mean(u, mask, weights, state, hp):
  norm = jnp.sqrt(jnp.sum(u * u, axis=1))
  bounded = u * jnp.minimum(1.0, hp["bound"] / jnp.maximum(norm, 1e-30))[:, None]
  return (ra.weighted_mean(bounded, mask, weights), state,
          metrics(jnp.sum(mask & (norm > hp["bound"]), dtype=jnp.int32)))


def ext_bound(bound: float = 1e-6) -> Aggregator:
  return Aggregator(name="ext_bound", aggregate=on_finite_uploads(_bounded_mean),
                    hparams={"bound": bound}, reports=("flagged",))


register_term(ext_decay)
register_aggregator(ext_bound)
'''


@pytest.fixture
def plugins(tmp_path):
  """The plugin files in a temporary folder; the registries and imported plugin
  modules put back as they were afterwards (other tests in this process read them)."""
  shutil.copy(LAPLACE, tmp_path / "laplace_mech.py")
  (tmp_path / "term_and_rule.py").write_text(TERM_AND_RULE)
  registries = (term_registry.TERMS, term_registry.ALGORITHMS, rule_registry.AGGREGATORS,
                mechanisms.MECHANISMS)
  saved = [dict(r) for r in registries]
  modules = set(sys.modules)
  yield {"laplace": str(tmp_path / "laplace_mech.py"),
         "term_and_rule": str(tmp_path / "term_and_rule.py")}
  for registry, before in zip(registries, saved):
    registry.clear()
    registry.update(before)
  for name in set(sys.modules) - modules:
    if name.startswith("fedjax_dp_plugin_"):
      del sys.modules[name]


def _laplace_module(plugins):
  fedjax_dp.make_config({"plugins": [plugins["laplace"]]})   # imports it, as the CLI does
  return sys.modules[[n for n in sys.modules if n.startswith("fedjax_dp_plugin_")][-1]]


def _sets(values: dict) -> list[str]:
  out = []
  for k, v in values.items():
    out += ["--set", f"{k}={json.dumps(v) if isinstance(v, list) else v}"]
  return out


def _laplace_epsilon(z: float, participations: int, delta: float) -> float:
  """dp-accounting's RDP accountant over `participations` Laplace reports, each of
  L1 sensitivity 2 C and scale z C (its noise_multiplier: scale / sensitivity)."""
  import dp_accounting
  acc = dp_accounting.rdp.RdpAccountant(orders=list(accounting.DEFAULT_ORDERS))
  acc.compose(dp_accounting.LaplaceDpEvent(noise_multiplier=z / 2), participations)
  return acc.get_epsilon(delta)


def test_laplace_rdp_is_dp_accountings(plugins):
  import dp_accounting
  module = _laplace_module(plugins)
  for z in (0.5, 2.0, 8.0):
    acc = dp_accounting.rdp.RdpAccountant(orders=list(accounting.DEFAULT_ORDERS))
    acc.compose(dp_accounting.LaplaceDpEvent(noise_multiplier=z / 2))
    np.testing.assert_allclose(module.event_rdp(z), acc._rdp, rtol=1e-9)
    # pure DP's limit: the curve never passes eps0 = 2 / z
    assert np.all(module.event_rdp(z) <= 2 / z + 1e-12)


def _reports(module, updates, z, clip=1.0):
  """The mechanism's client half over [n, d] updates, client i from stream i."""
  setup = mechanisms.RoundSetup(None, updates.shape[0], 1, False, 0, 0, 7)
  one = lambda u, cid: module.client(setup, u, cid, jax.random.PRNGKey(3), jnp.float32(clip),
                                     {"update_noise": jnp.float32(z)}, None, 1.0)
  return jax.vmap(one)(updates, jnp.arange(updates.shape[0]))


def test_laplace_noise_has_its_closed_form_distribution(plugins):
  module = _laplace_module(plugins)
  z, clip = 3.0, 0.5
  reports, norms = _reports(module, jnp.zeros((2000, 100)), z, clip)
  noise = np.asarray(reports).ravel()
  b = z * clip
  assert abs(np.mean(np.abs(noise)) / b - 1) < 0.01    # E|X| = b
  assert abs(np.var(noise) / (2 * b * b) - 1) < 0.02   # Var X = 2 b^2
  assert scipy.stats.kstest(noise, scipy.stats.laplace(scale=b).cdf).pvalue > 1e-3
  # the clip: an update of L1 norm 4 C is scaled to C, its direction kept
  big = jnp.tile(jnp.array([[2.0, -2.0, 0.0, 0.0]]), (20000, 1))
  reports, norms = _reports(module, big, 1e-9, clip)   # (almost) no noise: the clip alone
  np.testing.assert_allclose(np.asarray(norms), 4.0)
  np.testing.assert_allclose(np.asarray(reports)[0], [0.25, -0.25, 0, 0], atol=1e-6)


def test_neighbouring_reports_cannot_be_told_apart_beyond_epsilon(plugins):
  """The best test between two neighbouring reports (+C and -C on one coordinate:
  L1 distance 2 C) is a threshold; its likelihood ratio reaches exp(eps0) for a
  threshold above C and never passes it. Measured, against dp-accounting's PLD
  epsilon of one Laplace report at a negligible delta."""
  import dp_accounting
  module = _laplace_module(plugins)
  z, n = 2.0, 400_000
  plus = np.asarray(_reports(module, jnp.full((n, 1), 1.0), z)[0]).ravel()
  minus = np.asarray(_reports(module, jnp.full((n, 1), -1.0), z)[0]).ravel()
  pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
  pld.compose(dp_accounting.LaplaceDpEvent(noise_multiplier=z / 2))
  bound = pld.get_epsilon(1e-12)
  assert abs(bound - 2 / z) < 0.01
  measured = []
  for t in (1.0, 1.5, 2.0, 3.0):   # thresholds at or above C: ratio exp(2 C / b) each
    measured.append(np.log(np.mean(plus > t) / np.mean(minus > t)))
  assert max(measured) < bound * 1.08           # within sampling error of the bound
  assert min(measured) > bound * 0.85           # and the attack reaches it: it is tight


def test_the_differential_method_recovers_laplace_noise_in_the_round(plugins):
  """The same run with and without the mechanism's noise (noise_multiplier z and 0,
  same keys): one client per round, so the models differ by that client's noise,
  Laplace(z C) in every coordinate."""
  from fedjax_dp.experiment.setup import setup
  base = {**SMALL, "plugins": [plugins["laplace"]], "dp": "laplace_local", "num_clients": 2,
          "clients_per_round": 1, "rounds": 1, "hidden": [64], "clip_norm": 0.25}
  params = []
  for z in (4.0, 0.0):
    _, _, sim = setup(fedjax_dp.make_config({**base, "noise_multiplier": z}))
    state, _ = sim.run_rounds(sim.init_state(), 1)
    params.append(np.concatenate([np.ravel(x) for x in jax.tree.leaves(state.params)]))
  noise = params[0] - params[1]
  assert noise.size > 4000
  assert scipy.stats.kstest(noise, scipy.stats.laplace(scale=4.0 * 0.25).cdf).pvalue > 1e-3


def test_a_mechanism_term_and_rule_run_from_plugins_through_the_cli(plugins, tmp_path):
  out = str(tmp_path / "mech")
  z = 4.0
  assert main(["run", "--no-progress", "--out", out] + _sets(
      {**SMALL, "plugins": [plugins["laplace"]], "dp": "laplace_local",
       "noise_multiplier": z})) == 0
  summary = json.load(open(os.path.join(out, "summary.json")))
  privacy = summary["privacy"]
  assert privacy["dp"] == "laplace_local" and "Laplace" in privacy["mechanism"]
  expected = {0: 0.0, **{k: _laplace_epsilon(z, k, 1e-5) for k in range(1, SMALL["rounds"] + 1)}}
  most = privacy["clients"]["participations"]["max"]
  # the in-round float32 ledger against dp-accounting's float64 composition
  assert privacy["epsilon"] == pytest.approx(expected[most], rel=1e-5)
  for eps in privacy["client_epsilons"]:
    assert any(eps == pytest.approx(e, rel=1e-5) for e in expected.values()), eps
  assert json.load(open(os.path.join(out, "config.json")))["plugins"] == [plugins["laplace"]]

  out = str(tmp_path / "term_rule")
  assert main(["run", "--no-progress", "--out", out] + _sets(
      {**SMALL, "plugins": [plugins["term_and_rule"]], "algorithm": "ext_decay",
       "aggregator": "ext_bound"})) == 0
  rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
  # every upload is above the rule's tiny bound: all five flagged in each of the
  # row's rounds
  assert rows[-1]["flagged"] == 5 * SMALL["eval_every"] and rows[-1]["round"] == SMALL["rounds"]


def test_a_sweep_over_the_mechanism_shares_one_program(plugins, tmp_path):
  spec = tmp_path / "sweep.yaml"
  spec.write_text(json.dumps({"config": {**SMALL, "plugins": [plugins["laplace"]],
                                         "dp": "laplace_local"},
                              "grid": {"noise_multiplier": [2.0, 8.0]}}))
  out = str(tmp_path / "sweep")
  assert main(["sweep", str(spec), "--out", out, "--no-progress"]) == 0
  record = json.load(open(os.path.join(out, "sweep.json")))
  assert len(record["programs"]) == 1 and len(record["programs"][0]["cells"]) == 2
  epsilons = {}
  for cell in record["cells"]:
    summary = json.load(open(os.path.join(out, "cells", cell["name"], "summary.json")))
    z = summary["privacy"]["noise_multiplier"]
    most = summary["privacy"]["clients"]["participations"]["max"]
    epsilons[z] = summary["privacy"]["epsilon"]
    assert epsilons[z] == pytest.approx(_laplace_epsilon(z, most, 1e-5), rel=1e-5)
  assert epsilons[2.0] > epsilons[8.0]


def test_fedjax_dp_run_takes_a_plugin_mechanism(plugins, tmp_path):
  summary = fedjax_dp.run("fedavg", out=str(tmp_path / "api"), progress=False,
                          plugins=[plugins["laplace"]], dp="laplace_local",
                          noise_multiplier=4.0, **{k: v for k, v in SMALL.items()
                                                   if k != "rounds"}, rounds=2)
  privacy = summary["privacy"]
  assert privacy["epsilon"] == pytest.approx(
      _laplace_epsilon(4.0, privacy["clients"]["participations"]["max"], 1e-5), rel=1e-5)


@pytest.mark.parametrize("sets, message", [
    ({"noise_schedule": "convergence"}, "config key 'noise_schedule' = 'convergence' with dp "
                                        "'laplace_local': this mechanism supports only 'static'"),
    ({"accountant": "pld"}, "config key 'accountant' = 'pld' with dp 'laplace_local': allowed "
                            "values are rdp"),
    ({"noise_multiplier": None, "target_epsilon": 5.0}, "dp 'laplace_local' needs "
                                                        "noise_multiplier"),
])
def test_a_plugin_mechanism_refuses_what_it_would_ignore(plugins, tmp_path, capsys, sets,
                                                         message):
  values = {**SMALL, "plugins": [plugins["laplace"]], "dp": "laplace_local",
            "noise_multiplier": 2.0, **sets}
  args = ["run", "--no-progress", "--out", str(tmp_path / "x")]
  for k, v in values.items():
    args += ["--set", f"{k}={'null' if v is None else json.dumps(v) if isinstance(v, list) else v}"]
  assert main(args) == 2
  err = capsys.readouterr().err.strip()
  assert message in err and len(err.splitlines()) == 1
  assert not os.path.exists(tmp_path / "x")


def test_a_missing_or_failing_plugin_is_one_line(tmp_path, capsys):
  bad = tmp_path / "bad.py"
  bad.write_text("raise RuntimeError('no GPU here')\n")
  for plugin, message in ((str(tmp_path / "nope.py"), "no such file"),
                          (str(bad), "importing it raised RuntimeError: no GPU here")):
    assert main(["run", "--no-progress", "--out", str(tmp_path / "x"),
                 "--set", f"plugins={plugin}"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
  assert not any(n.startswith("fedjax_dp_plugin_") and "bad" in str(getattr(m, "__file__", ""))
                 for n, m in sys.modules.items())
