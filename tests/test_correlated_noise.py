"""Correlated-noise DP (issue 42): DP-FTRL's tree, BandMF and BLT in the compiled
round, with participation the sampler enforces ('cyclic').

Checked against independent references: the applied noise's covariance across
rounds, measured by the differential method (the same keys with the configured
noise and with a negligible one), against C^{-1} C^{-T} of the strategy
materialised by jax-privacy (BandMF, BLT) or written from the tree's definition;
the sensitivity against a brute force over every participation pattern; the
epsilon against dp-accounting; the sampler's schedule against its schema."""

import itertools
import json
import math

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.linalg import block_diag

import fedjax_dp
from fedjax_dp.errors import ConfigError
from fedjax_dp.experiment.setup import setup as setup_run
from fedjax_dp.placement import participation
from fedjax_dp.privacy.mechanisms import correlated, tree

ROUNDS, CLIENTS, PER_ROUND = 12, 40, 10      # cyclic: b = 4 groups, 3 participations each
SMALL = {"dataset": "digits", "num_clients": CLIENTS, "clients_per_round": PER_ROUND,
         "sampling": "cyclic", "rounds": ROUNDS, "eval_every": ROUNDS, "hidden": [16],
         "devices": 1, "clip_norm": 1.0}


@pytest.fixture(autouse=True)
def strategy_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("FEDJAX_DP_CACHE", str(tmp_path / "cache"))


def tree_matrix(length: int) -> np.ndarray:
  """The binary tree's completed-node matrix over `length` rounds, from its
  definition: round c (1-based) releases the sum of rounds c - 2^tz(c) + 1 .. c."""
  c_mat = np.zeros((length, length))
  for c in range(1, length + 1):
    low = c & -c
    c_mat[c - 1, c - low:c] = 1.0
  return c_mat


def strategy_matrix(sim) -> np.ndarray:
  """C of the run's strategy, materialised by jax-privacy (BandMF, BLT) or from the
  tree's definition (restarted every min_sep rounds)."""
  from jax_privacy.matrix_factorization import banded, buffered_toeplitz
  from fedjax_dp.privacy.mechanisms import strategy_cache
  p = sim.privacy
  name = p.strategy.name
  if name == "tree":
    b = p.participation.min_sep
    return block_diag(*[tree_matrix(min(b, ROUNDS - s)) for s in range(0, ROUNDS, b)])
  if name == "bandmf":
    params = strategy_cache.bandmf_params(ROUNDS, p.participation.min_sep, 0.0)
    return np.asarray(banded.ColumnNormalizedBanded(params=jnp.asarray(params)).materialize(),
                      np.float64)
  decay, scale = strategy_cache.blt_params(ROUNDS, p.participation.min_sep,
                                           p.participation.max_participations)
  with jax.enable_x64():
    blt = buffered_toeplitz.BufferedToeplitz.build(buf_decay=decay, output_scale=scale)
    return np.asarray(blt.materialize(ROUNDS), np.float64)


def model_changes(sim, key) -> np.ndarray:
  """[rounds, params]: each round's model change, from run key `key` (a
  measurement, never released: same_draws)."""
  state = sim.init_state()._replace(key=jnp.asarray(key))   # a fresh buffer: donated
  flat = lambda s: np.concatenate([np.ravel(np.asarray(x, np.float64))
                                   for x in jax.tree.leaves(s.params)])
  out, last = [], flat(state)
  for _ in range(ROUNDS):
    state, _ = sim.run_rounds(state, 1, same_draws=True)
    now = flat(state)
    out.append(now - last)
    last = now
  return np.stack(out)


@pytest.mark.parametrize("dp", ["tree", "bandmf", "blt"])
def test_the_applied_noise_has_the_strategys_covariance_across_rounds(dp):
  """The differential method: the same run key with noise multiplier 2 and 1e-6
  (the clients' learning rate 1e-12, so their updates do not move the models
  apart); each round's model change is then the noise over clients_per_round.
  Its covariance across rounds, over ~19,000 coordinates, is
  (z sens C)^2 C_s^{-1} C_s^{-T}: C_s materialised independently of the round's
  streaming code, sens^2 by brute force (below)."""
  from fedjax_dp.experiment.setup import setup
  cfg = {**SMALL, "dp": dp, "lr": 1e-12, "hidden": [256]}
  sims = [setup(fedjax_dp.make_config({**cfg, "noise_multiplier": z}))[2] for z in (2.0, 1e-6)]
  key = np.asarray(sims[0].init_state().key)
  noise = (model_changes(sims[0], key) - model_changes(sims[1], key)) * PER_ROUND  # [n, d]
  std = sims[0].privacy.strategy.noise_std(2.0, 1.0)
  c_inv = np.linalg.inv(strategy_matrix(sims[0]))
  want = std ** 2 * c_inv @ c_inv.T
  got = noise @ noise.T / noise.shape[1]
  assert noise.shape[1] > 18_000
  scale = np.sqrt(np.outer(np.diag(want), np.diag(want)))
  np.testing.assert_allclose(got / scale, want / scale, atol=0.05)
  assert np.max(np.abs(np.diag(got) / np.diag(want) - 1)) < 0.05


def worst_sensitivity2(c_mat: np.ndarray, min_sep: int) -> float:
  """max over every participation pattern with rounds at least min_sep apart of
  ||sum of C's columns at those rounds||^2 (brute force)."""
  n = c_mat.shape[0]
  best = 0.0
  for k in range(1, math.ceil(n / min_sep) + 1):
    for rounds in itertools.combinations(range(n), k):
      if all(b - a >= min_sep for a, b in zip(rounds, rounds[1:])):
        best = max(best, float(np.sum(np.square(c_mat[:, list(rounds)].sum(axis=1)))))
  return best


@pytest.mark.parametrize("dp", ["tree", "bandmf", "blt"])
def test_the_sensitivity_is_the_worst_participation_pattern(dp):
  """sens^2 equals the brute force over every min-sep pattern (BLT: jax-privacy's
  Toeplitz bound, at least the brute force; the tree: restarted every min_sep
  rounds, so a pattern of one participation per tree), and each client's own
  cyclic schedule is among them."""
  from fedjax_dp.experiment.setup import setup
  sim = setup(fedjax_dp.make_config({**SMALL, "dp": dp, "noise_multiplier": 1.0}))[2]
  c_mat, s = strategy_matrix(sim), sim.privacy.strategy
  b = sim.privacy.participation.min_sep
  assert (b, sim.privacy.participation.max_participations) == (4, 3)
  brute = worst_sensitivity2(c_mat, b)
  if dp == "blt":
    assert brute <= s.sensitivity2 * (1 + 1e-6) and s.sensitivity2 < 1.05 * brute
  else:
    assert s.sensitivity2 == pytest.approx(brute, rel=1e-6)
  cyclic = max(np.sum(np.square(c_mat[:, g::b].sum(axis=1))) for g in range(b))
  assert cyclic <= s.sensitivity2 * (1 + 1e-6)
  assert np.sum(s.charges) == pytest.approx(1.0) and np.all(s.charges >= 0)


@pytest.mark.parametrize("dp", ["tree", "bandmf", "blt"])
def test_the_epsilon_is_dp_accountings_gaussian_and_the_ledger_covers_each_prefix(dp, tmp_path):
  """The run's epsilon is dp-accounting's RDP epsilon of one Gaussian of multiplier
  z (the strategy's sensitivity is in the noise); after each round the ledger holds
  at least the Gaussian of the released rounds' sensitivity (brute force on C's
  leading block)."""
  z = 1.5
  out = str(tmp_path / dp)
  fedjax_dp.run({**SMALL, "dp": dp, "noise_multiplier": z}, out=out, progress=False,
                log=lambda m: None)
  report = json.load(open(f"{out}/summary.json"))["privacy"]
  acc = dp_accounting.rdp.RdpAccountant(
      [float(a) for a in fedjax_dp.privacy.accounting.DEFAULT_ORDERS])
  acc.compose(dp_accounting.GaussianDpEvent(z))
  assert report["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-5)
  # jax-privacy's own accountant of un-amplified DP-FTRL: one Gaussian release
  from jax_privacy.accounting import accountants, analysis
  single = analysis.SingleReleaseTrainingAccountant(accountants.RdpAccountantConfig(
      orders=[float(a) for a in fedjax_dp.privacy.accounting.DEFAULT_ORDERS]))
  params = analysis.DpParams(noise_multipliers=z, num_samples=CLIENTS, delta=1e-5,
                             batch_size=PER_ROUND)
  assert report["epsilon"] == pytest.approx(single.compute_epsilon(ROUNDS, params), rel=1e-5)
  assert report["correlated_noise"]["charged_share"] == pytest.approx(1.0)
  from fedjax_dp.experiment.setup import setup
  sim = setup(fedjax_dp.make_config({**SMALL, "dp": dp, "noise_multiplier": z}))[2]
  c_mat, s = strategy_matrix(sim), sim.privacy.strategy
  b = sim.privacy.participation.min_sep
  for t in range(1, ROUNDS + 1):
    released = worst_sensitivity2(c_mat[:t, :t], b)
    assert np.sum(s.charges[:t]) * s.sensitivity2 >= released - 1e-6


def test_refusals_are_one_line():
  base = {**SMALL, "noise_multiplier": 1.0}
  with pytest.raises(ConfigError, match="'sampling' = 'cyclic' with dp 'central'"):
    fedjax_dp.make_config({**base, "dp": "central"})
  with pytest.raises(ConfigError, match="'mf_bands' = 5 with dp 'bandmf': at most the rounds"):
    fedjax_dp.make_config({**base, "dp": "bandmf", "mf_bands": 5})
  with pytest.raises(ConfigError, match="'mf_bands' = 2 is read by nothing"):
    fedjax_dp.make_config({**base, "dp": "blt", "mf_bands": 2})
  with pytest.raises(ConfigError, match="needs num_clients \\(40\\) a multiple"):
    fedjax_dp.make_config({**base, "dp": "tree", "clients_per_round": 7})
  with pytest.raises(ConfigError, match="config key 'clip_count_stddev' = 0.8: adaptive clipping "
                     "beside correlated noise needs the count's std > z sqrt\\(k\\) / 2 = "
                     "0.866025"):
    setup_run(fedjax_dp.make_config(
        {**base, "dp": "tree", "adaptive_clipping": True, "clip_count_stddev": 0.8}))


def test_charges_from_prefixes_charge_each_stretch_when_it_opens():
  got = correlated.charges_from_prefixes(6, [1, 3, 6], [1.0, 2.0, 4.0])
  np.testing.assert_allclose(got, [0.25, 0.25, 0.0, 0.5, 0.0, 0.0])
  with pytest.raises(ValueError, match="must rise to rounds 6"):
    correlated.charges_from_prefixes(6, [1, 3], [1.0, 2.0])
  assert tree.levels(1) == 1 and tree.levels(4) == 3 and tree.levels(7) == 3


@pytest.mark.slow   # four runs: make test-slow (CI runs it)
@pytest.mark.parametrize("dp", ["tree", "blt"])
def test_a_run_stopped_mid_strategy_resumes_bit_for_bit(dp, tmp_path):
  """The noise buffers are in the checkpointed round state: a run stopped at round 6
  of 12 (Ctrl-C) and resumed ends with the uninterrupted run's model and epsilon,
  bit for bit; a resume with other rounds (another strategy) is refused."""
  from fedjax_dp.callbacks import Callback
  from fedjax_dp.errors import RunError
  values = {**SMALL, "dp": dp, "noise_multiplier": 2.0, "checkpoint_every": 2}
  quiet = dict(progress=False, log=lambda m: None)
  fedjax_dp.run(values, out=str(tmp_path / "whole"), **quiet)

  def stop_at_6(ctx, stats):
    if ctx.round == 6:
      raise KeyboardInterrupt
  with pytest.raises(KeyboardInterrupt):
    fedjax_dp.run(values, out=str(tmp_path / "cut"), callbacks=[Callback(after_chunk=stop_at_6)],
                  **quiet)
  with pytest.raises(RunError, match="strategy was built for 12 rounds"):
    fedjax_dp.run({**values, "rounds": 16}, out=str(tmp_path / "cut"), resume=True, **quiet)
  fedjax_dp.run(values, out=str(tmp_path / "cut"), resume=True, **quiet)
  a, b = (json.load(open(tmp_path / d / "summary.json")) for d in ("whole", "cut"))
  assert a["privacy"]["epsilon"] == b["privacy"]["epsilon"]
  for x, y in zip(*(jax.tree.leaves(fedjax_dp.load_params(str(tmp_path / d)))
                    for d in ("whole", "cut"))):
    np.testing.assert_array_equal(x, y)


def test_sweep_replicas_draw_their_own_correlated_noise():
  """A sweep's seeds run as vmapped replicas of one program (Simulation.run_replicas):
  each replica carries its own noise buffers and draws its own noise (its release's
  key), and ends where its seed run alone ends (batched matmuls round apart by
  about 1e-7)."""
  from fedjax_dp.experiment.setup import setup
  sim = setup(fedjax_dp.make_config({**SMALL, "dp": "bandmf", "noise_multiplier": 2.0}))[2]
  seeds = [sim.with_seed(s) for s in (0, 1)]
  alone = [s.run_rounds(s.init_state(), 4)[0] for s in seeds]
  stack = lambda trees: jax.tree.map(lambda *a: jnp.stack(a), *trees)
  both, _ = sim.run_replicas(sim.to_working(stack([s.init_state() for s in seeds])),
                             stack([s.hparams for s in seeds]), 4)
  for r, single in enumerate(alone):
    for x, y in zip(jax.tree.leaves((single.params, single.privacy.noise)),
                    jax.tree.leaves((both.params, both.privacy.noise))):
      np.testing.assert_allclose(np.asarray(y[r]), np.asarray(x), rtol=1e-4, atol=1e-6)
  first = [np.ravel(np.asarray(jax.tree.leaves(a.privacy.noise)[1])) for a in alone]
  assert not np.allclose(first[0], first[1])


def test_account_plans_the_runs_epsilon(tmp_path):
  """fedjax-dp account --config's plan equals the finished run's summary.json epsilon
  (calibrated to a target: the run's float32 ledger composing the strategy's shares)."""
  from fedjax_dp.experiment import plan_privacy
  values = {**SMALL, "dp": "tree", "target_epsilon": 6.0}
  fedjax_dp.run(values, out=str(tmp_path / "r"), progress=False, log=lambda m: None)
  ran = json.load(open(tmp_path / "r" / "summary.json"))["privacy"]["epsilon"]
  planned = plan_privacy.plan(fedjax_dp.make_config(values))
  assert planned["epsilon"] == pytest.approx(ran, rel=1e-12, abs=0) and ran <= 6.0
  assert planned["correlated_noise"]["sensitivity"] == pytest.approx(3.0)
  assert "one Gaussian of multiplier" in plan_privacy.format_plan(planned)


def test_what_the_audit_found_is_refused():
  """An independent audit: a noise schedule scaled the decoded noise while the
  ledger charged the configured one (26.7 released, 2.17 reported); rounds run past
  the strategy's were charged nothing; a resume read only segments.jsonl; a sweep
  over server momentum kept BandMF's first strategy while reporting another; kept
  noise's chain amplified a schedule by sampling."""
  from fedjax_dp.experiment.setup import setup
  from fedjax_dp.recipes.hparams import StructureChange
  base = {**SMALL, "noise_multiplier": 2.0}
  with pytest.raises(ConfigError, match="'noise_schedule' = 'convergence' with dp 'tree'"):
    fedjax_dp.make_config({**base, "dp": "tree", "noise_schedule": "convergence"})
  with pytest.raises(ConfigError, match="'sampling' = 'cyclic' with kept_noise 'multiplier'"):
    fedjax_dp.make_config({**SMALL, "algorithm": "topksdp", "s_local": 0.9,
                           "index_selection": "random_k", "final_clip_l2": 0.5,
                           "kept_noise": "multiplier", "kept_noise_multiplier": 1.0})
  sim = setup(fedjax_dp.make_config({**base, "dp": "blt"}))[2]
  state, _ = sim.run_rounds(sim.init_state(), ROUNDS - 2)
  with pytest.raises(ConfigError, match="pass the 12 rounds dp 'blt'.s strategy was built for"):
    sim.run_rounds(state, 3)
  state, _ = sim.run_rounds(state, 2)   # up to its last round is fine
  bandmf = setup(fedjax_dp.make_config({**base, "dp": "bandmf", "server_optimizer": "momentum",
                                        "server_momentum": 0.9}))[2]
  with pytest.raises(StructureChange, match="change the privacy set-up's structure"):
    bandmf.with_hparams(server_momentum=0.5)
  from fedjax_dp.experiment.reports.privacy_report import privacy_report
  report = privacy_report(sim.cfg, sim, state, None)
  assert "q" not in report and report["correlated_noise"]["charged_share"] == pytest.approx(1)


def test_a_resume_with_other_rounds_is_refused_without_segments(tmp_path):
  from fedjax_dp.errors import RunError
  import os
  values = {**SMALL, "dp": "tree", "noise_multiplier": 2.0, "rounds": 4, "eval_every": 4}
  fedjax_dp.run(values, out=str(tmp_path / "r"), progress=False, log=lambda m: None)
  os.remove(tmp_path / "r" / "segments.jsonl")
  with pytest.raises(RunError, match="strategy was built for 4 rounds"):
    fedjax_dp.run({**values, "rounds": 8}, out=str(tmp_path / "r"), resume=True,
                  progress=False, log=lambda m: None)


def test_the_dp_ftrl_recipe_is_the_flat_configs():
  """recipes.dp_ftrl(strategy, ...) is the config dp=<strategy> with its keys (mf_bands
  only where the mechanism reads it), and runs through fedjax_dp.run."""
  from fedjax_dp import recipes
  setup_keys = {k: v for k, v in SMALL.items()}
  got = recipes.dp_ftrl("bandmf", noise_multiplier=1.5, mf_bands=2).to_config(**setup_keys)
  want = fedjax_dp.make_config({**SMALL, "dp": "bandmf", "noise_multiplier": 1.5, "mf_bands": 2})
  assert got.to_dict() == want.to_dict()
  assert recipes.dp_ftrl("tree").to_config(**setup_keys).mf_bands is None
  assert "dp_ftrl" in recipes.NAMED


def test_the_pld_figure_is_dp_accountings_for_the_one_gaussian(tmp_path):
  """accountant pld: the run's epsilon is dp-accounting's PLD of the Gaussian of
  multiplier z (below the RDP ledger's), and account --config plans the same."""
  from fedjax_dp.experiment import plan_privacy
  from fedjax_dp.privacy.planning import PLD_DISCRETISATION
  values = {**SMALL, "dp": "tree", "noise_multiplier": 1.5, "accountant": "pld"}
  fedjax_dp.run(values, out=str(tmp_path / "r"), progress=False, log=lambda m: None)
  report = json.load(open(tmp_path / "r" / "summary.json"))["privacy"]
  acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=PLD_DISCRETISATION)
  acc.compose(dp_accounting.GaussianDpEvent(1.5))
  assert report["epsilon_accountant"] == "pld"
  assert report["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
  assert report["epsilon"] < report["rdp_epsilon"]
  planned = plan_privacy.plan(fedjax_dp.make_config(values))
  assert planned["epsilon"] == pytest.approx(report["epsilon"], rel=1e-12)


def test_the_noise_ratio_from_the_report_is_the_runs():
  """The CLI's divergence advice reads the noise from summary.json once the run is
  gone: for correlated noise the same ratio the run said before round 1 (it quoted
  z / m, without the strategy's sensitivity and rows)."""
  from fedjax_dp.experiment import noise_note
  from fedjax_dp.experiment.reports.privacy_report import privacy_report
  from fedjax_dp.experiment.setup import setup
  sim = setup(fedjax_dp.make_config({**SMALL, "dp": "tree", "noise_multiplier": 2.0}))[2]
  state, _ = sim.run_rounds(sim.init_state(), 2)
  report = privacy_report(sim.cfg, sim, state, None)
  want = noise_note.mean_update_ratio(sim.cfg, 2.0, sim.privacy.strategy)
  assert noise_note.reported_ratio(sim.cfg, report) == pytest.approx(want, rel=1e-12)
  assert want > 2.0 / PER_ROUND * 2.9   # sensitivity 3: three trees of 4 rounds, 3 levels each


@pytest.mark.parametrize("dp", ["tree", "bandmf", "blt"])
def test_adaptive_clipping_charges_its_count_queries_beside_the_strategy(dp, tmp_path):
  """Adaptive clipping beside correlated noise: the run's epsilon is dp-accounting's
  composition of the strategy's Gaussian at the updates' multiplier z_u with k count
  queries of std s (sensitivity 1/2, multiplier 2 s), one per participation; that pair
  is the calibrated z; after every round the ledger covers the released rounds'
  sensitivity (brute force) and the count queries of the participations begun; the
  clip norm moves."""
  z = 1.5
  out = str(tmp_path / dp)
  fedjax_dp.run({**SMALL, "dp": dp, "noise_multiplier": z, "adaptive_clipping": True},
                out=out, progress=False, log=lambda m: None)
  report = json.load(open(f"{out}/summary.json"))["privacy"]
  ad = report["adaptive_clipping"]
  k = report["correlated_noise"]["participation"]["max_participations"]
  z_u, s = ad["update_noise_multiplier"], ad["count_stddev"]
  assert s == pytest.approx(max(PER_ROUND / 20, z * math.sqrt(k)))
  orders = [float(a) for a in fedjax_dp.privacy.accounting.DEFAULT_ORDERS]
  event = dp_accounting.ComposedDpEvent([
      dp_accounting.GaussianDpEvent(z_u),
      dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(2 * s), k)])
  want = dp_accounting.rdp.RdpAccountant(orders).compose(event).get_epsilon(1e-5)
  assert report["epsilon"] == pytest.approx(want, rel=1e-5)
  assert want == pytest.approx(dp_accounting.rdp.RdpAccountant(orders).compose(
      dp_accounting.GaussianDpEvent(z)).get_epsilon(1e-5), rel=1e-5)
  assert report["correlated_noise"]["noise_std"] == pytest.approx(
      z_u * report["correlated_noise"]["sensitivity"])
  assert ad["final_clip_norm"] != 1.0
  from fedjax_dp.experiment.setup import setup
  sim = setup(fedjax_dp.make_config({**SMALL, "dp": dp, "noise_multiplier": z,
                                     "adaptive_clipping": True}))[2]
  strategy, b = sim.privacy.strategy, sim.privacy.participation.min_sep
  c_mat = strategy_matrix(sim)
  sens2 = strategy.sensitivity2
  for t in range(1, ROUNDS + 1):
    charged = np.sum(strategy.charges[:t])
    held = charged * (sens2 / z_u ** 2 + k / (2 * s) ** 2)   # RDP / (alpha / 2) held
    released = worst_sensitivity2(c_mat[:t, :t], b) / z_u ** 2 + math.ceil(t / b) / (2 * s) ** 2
    assert held >= released * (1 - 1e-6), t   # C materialised in float32
  assert np.sum(strategy.charges) == pytest.approx(1.0)


def test_adaptive_clipping_under_amplified_bandmf_rides_in_each_participation():
  """Amplified: the count query is released with its participation's column, by the
  same draw, so each participation is one subsampled Gaussian of the pair's
  multiplier (1/z^2 = 1/z_u^2 + 1/(2 s)^2), k of them (jax-privacy's amplified event)."""
  from jax_privacy.experimental import accounting as jp_accounting
  from fedjax_dp.experiment import plan_privacy
  from fedjax_dp.privacy.mechanisms.base import poisson_rate_used
  values = {**SMALL, "dp": "bandmf", "sampling": "cyclic_poisson", "min_separation": 2,
            "noise_multiplier": 1.5, "adaptive_clipping": True}
  cfg = fedjax_dp.make_config(values)
  planned = plan_privacy.plan(cfg)
  from fedjax_dp.experiment.setup import setup
  p = setup(cfg)[2].privacy
  assert (p.update_noise_multiplier ** -2 + (2 * p.count_stddev) ** -2) ** -0.5 == (
      pytest.approx(1.5))
  assert p.count_stddev == pytest.approx(max(PER_ROUND / 20, 1.5))
  event = jp_accounting.amplified_bandmf_event(1.5, ROUNDS, num_bands=2,
                                               sampling_prob=poisson_rate_used(0.5))
  orders = [float(a) for a in fedjax_dp.privacy.accounting.DEFAULT_ORDERS]
  assert planned["epsilon"] == pytest.approx(
      dp_accounting.rdp.RdpAccountant(orders).compose(event).get_epsilon(1e-5), rel=1e-5)


def test_the_server_learning_rate_schedule_scales_each_rounds_step():
  """server_lr_schedule 'cosine': round t's model change is (alpha + (1 - alpha)(1 +
  cos(pi t / rounds)) / 2) times the constant schedule's from the same state and
  keys (the closed form, written here)."""
  from fedjax_dp.experiment.setup import setup
  base = {**SMALL, "dp": "none", "clip_norm": None, "sampling": "fixed", "lr": 0.1}
  base.pop("clip_norm")
  flat_sim = setup(fedjax_dp.make_config(base))[2]
  cos_sim = setup(fedjax_dp.make_config({**base, "server_lr_schedule": "cosine",
                                         "server_lr_min": 0.2}))[2]
  start = flat_sim.init_state()
  flat = lambda s: np.concatenate([np.ravel(np.asarray(x, np.float64))
                                   for x in jax.tree.leaves(s.params)])
  before = flat(start)
  for t in (0, 5, 11):
    moves = []
    for sim in (flat_sim, cos_sim):   # a fresh copy each: run_rounds donates its state
      state = jax.tree.map(jnp.array, start._replace(round=jnp.int32(t)))
      after, _ = sim.run_rounds(sim.replicate(state), 1, same_draws=True)
      moves.append(flat(after) - before)
    want = 0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi * t / ROUNDS))
    # (float32 params near 0.3: the moves are exact to ~3e-8)
    np.testing.assert_allclose(moves[1], want * moves[0], rtol=1e-4, atol=6e-8)
    assert np.max(np.abs(moves[0])) > 1e-4


def test_bandmf_is_optimised_for_the_decaying_server_learning_rate():
  """With server_lr_schedule 'cosine', BandMF's strategy is optimised for momentum
  SGD's workload at those rates: its error on that workload (jax-privacy's
  per_query_error) is below the prefix-sum strategy's with the same bands (column
  normalised: the same sensitivity)."""
  from jax_privacy.matrix_factorization import banded, streaming_matrix
  from fedjax_dp.experiment.setup import setup
  values = {**SMALL, "dp": "bandmf", "noise_multiplier": 1.0, "rounds": 40,
            "num_clients": 80, "eval_every": 40, "server_lr_schedule": "cosine",
            "server_lr_min": 0.05}
  decayed = setup(fedjax_dp.make_config(values))[2].privacy.strategy
  plain = setup(fedjax_dp.make_config({**values, "server_lr_schedule": "constant",
                                       "server_lr_min": 0.0}))[2].privacy.strategy
  assert "cosine server learning rate to 0.05" in decayed.says
  rates = jnp.asarray([0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * t / 40)) for t in range(40)])
  workload = streaming_matrix.momentum_sgd_matrix(0.0, learning_rates=rates)
  from fedjax_dp.privacy.mechanisms import strategy_cache
  errors = []
  for decay in (0.05, None):
    params = strategy_cache.bandmf_params(40, 8, 0.0, lr_decay=decay,
                                          rates=np.asarray(rates) if decay else None)
    c = banded.ColumnNormalizedBanded(params=jnp.asarray(params))
    errors.append(float(jnp.mean(banded.per_query_error(c, A=workload))))
  assert errors[0] < errors[1] * (1 - 1e-4)   # the prefix-sum optimum is not this one
  assert decayed.sensitivity2 == pytest.approx(plain.sensitivity2, rel=1e-5)


def test_a_count_too_noisy_to_steer_the_clip_is_warned_of(tmp_path):
  """audit: beside correlated noise the default count std grows with sqrt(k); a client
  in every round (fixed cohorts) gets a count too noisy to steer the clip, said before
  round 1 (std over the cohort above noise_note.COUNT_WANDERS = 0.25); a cyclic
  schedule's (3 participations: 0.14 at z = 0.8) is not."""
  said = []
  fedjax_dp.run({**SMALL, "dp": "tree", "noise_multiplier": 1.5, "adaptive_clipping": True,
                 "sampling": "fixed"}, out=str(tmp_path / "f"), progress=False, log=said.append)
  assert any("count noise (std 5.2, 0.52 of the cohort)" in line for line in said), said
  said.clear()
  fedjax_dp.run({**SMALL, "dp": "tree", "noise_multiplier": 0.8, "adaptive_clipping": True},
                out=str(tmp_path / "c"), progress=False, log=said.append)
  assert not any("count noise" in line for line in said)
