"""Accounting follows what the rounds applied (issue 18): the per-round record,
resumes that change `rounds`, adaptive clipping with tiers, non-finite uploads,
the secret noise seed and the Poisson rate the sampler really uses."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from fedjax_dp.experiment.reports import privacy_log
from fedjax_dp.cli import main
from fedjax_dp.experiment.runner import run_experiment
from fedjax_dp.errors import RunError
from fedjax_dp.experiment.reports.privacy_report import privacy_report
from fedjax_dp import make_config
from tests.helpers import toy_problem, toy_simulation

dpa = pytest.importorskip("dp_accounting")

BASE = {"dataset": "digits", "num_clients": 40, "clients_per_round": 4, "sampling": "poisson",
        "hidden": [8], "batch_size": 32, "lr": 0.05, "devices": 1, "dp": "central",
        "clip_norm": 0.5, "accountant": "pld", "eval_every": 2, "checkpoint_every": 2}


# BASE without its DP mechanism (a run without dp reads none of these keys)
NO_DP = {k: v for k, v in BASE.items() if k not in ("dp", "clip_norm", "accountant")}


def run(out, resume=False, base=BASE, **over):
  return run_experiment(make_config({**base, **over}), str(out), resume=resume, progress=False,
                        log=lambda m: None)


def oracle(events, q, delta=1e-5, pld=True):
  acc = dpa.pld.PLDAccountant() if pld else dpa.rdp.RdpAccountant()
  for z, n in events:
    acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), n)
  return acc.get_epsilon(delta)


@pytest.mark.slow   # make test's 10 minutes (CI runs it in make test-slow)
def test_resume_with_more_rounds_calibrates_only_the_rounds_to_come(tmp_path):
  # finding 2: the PLD report re-derived every round at the new multiplier (2.68 for 3.25)
  first = run(tmp_path / "r", rounds=4, target_epsilon=8.0)["privacy"]
  z1 = first["noise_multiplier"]
  second = run(tmp_path / "r", resume=True, rounds=10, target_epsilon=8.0)["privacy"]
  events = [(e["accounted_noise_multiplier"], e["rounds"]) for e in second["noise_events"]]
  assert events[0] == (z1, 4) and events[1][1] == 6 and events[1][0] > z1
  q = second["q"]
  assert second["pld_epsilon"] == pytest.approx(oracle(events, q), rel=1e-3)
  rdp = oracle(events, q, pld=False)
  assert rdp <= 8.0 and rdp == pytest.approx(8.0, rel=2e-3)   # the rest of the target, used
  assert second["epsilon"] <= 8.0 and not second["stopped_by_budget"]


@pytest.mark.slow   # make test's 10 minutes (CI runs it in make test-slow)
def test_extending_a_spent_calibrated_run_warns_that_the_rounds_to_come_are_noise(tmp_path):
  run(tmp_path / "r", rounds=4, target_epsilon=8.0)
  said = []
  run_experiment(make_config({**BASE, "rounds": 8, "target_epsilon": 8.0}), str(tmp_path / "r"),
                 resume=True, progress=False, log=said.append)
  warning = [m for m in said if m.startswith("warning: the rounds to come get ")]
  assert len(warning) == 1 and "x the noise of the rounds run" in warning[0]
  # a run stopped at round 4 of 10 (Ctrl-C) has budget left: 12 rounds spread it, no warning
  from fedjax_dp.callbacks import Callback

  def stop_at_4(ctx, stats):
    if ctx.round == 4:
      raise KeyboardInterrupt
  with pytest.raises(KeyboardInterrupt):
    run_experiment(make_config({**BASE, "rounds": 10, "target_epsilon": 8.0}),
                   str(tmp_path / "s"), progress=False, log=lambda m: None,
                   callbacks=[Callback(after_chunk=stop_at_4)])
  said.clear()
  run_experiment(make_config({**BASE, "rounds": 12, "target_epsilon": 8.0}), str(tmp_path / "s"),
                 resume=True, progress=False, log=said.append)
  assert any("calibrated to what is left" in m for m in said)
  assert not any(m.startswith("warning") for m in said)


# ~9 s (three runs): `make test-slow` (CI runs it); the fallback itself is test_checkpoint's
@pytest.mark.slow
def test_a_resumed_extension_repeats_bit_for_bit_after_a_checkpoint_fallback(tmp_path):
  run(tmp_path / "r", rounds=4, target_epsilon=8.0)
  full = run(tmp_path / "r", resume=True, rounds=8, target_epsilon=8.0)
  rows = [json.loads(x) for x in open(tmp_path / "r" / "metrics.jsonl")]
  # the newest checkpoint lost: rounds 7-8 run again under the calibration saved at round 6
  shutil.rmtree(tmp_path / "r" / "checkpoints" / "8")
  os.remove(tmp_path / "r" / "summary.json")
  again = run(tmp_path / "r", resume=True, rounds=8, target_epsilon=8.0)
  rows2 = [json.loads(x) for x in open(tmp_path / "r" / "metrics.jsonl")]
  assert [r["test_loss"] for r in rows2] == [r["test_loss"] for r in rows]
  assert again["privacy"]["noise_events"] == full["privacy"]["noise_events"]


# ~8 s: `make test-slow` (CI runs it)
@pytest.mark.slow
def test_a_rerun_under_other_rounds_and_a_schedule_is_refused(tmp_path, capsys):
  # finding 15: rounds 3-4 would re-run with another learning rate under the same noise
  out = tmp_path / "r"
  run(out, rounds=4, noise_multiplier=1.0, lr_schedule="cosine", lr_min=0.01)
  shutil.rmtree(out / "checkpoints" / "4")
  before = {p: open(out / p, "rb").read() for p in ("config.json", "metrics.jsonl")}
  with pytest.raises(RunError, match="rounds=4 first"):
    run(out, resume=True, rounds=8, noise_multiplier=1.0, lr_schedule="cosine", lr_min=0.01)
  assert {p: open(out / p, "rb").read() for p in before} == before   # nothing touched
  argv = ["run", "--resume", "--no-progress", "--out", str(out)]
  for k, v in {**BASE, "rounds": 8, "noise_multiplier": 1.0, "lr_schedule": "cosine",
               "lr_min": 0.01}.items():
    argv += ["--set", f"{k}={json.dumps(v) if isinstance(v, list) else v}"]
  assert main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "rounds=4" in err[0]
  # the way out it names: redo rounds 3-4 as they were, then extend
  run(out, resume=True, rounds=4, noise_multiplier=1.0, lr_schedule="cosine", lr_min=0.01)
  done = run(out, resume=True, rounds=8, noise_multiplier=1.0, lr_schedule="cosine",
             lr_min=0.01)
  assert done["rounds"] == 8


def applied_multiplier(sim):
  """The accounted multiplier of the noise the round draws: the parts' std over
  their bounds and the count's std over its sensitivity 1/2, composed."""
  p, layout = sim.privacy, sim.privacy.layout
  parts = [p.update_noise_multiplier * m / f
           for f, m in zip(layout.fractions, layout.noise_scales or (1.0,) * len(layout.fractions))]
  count = [2 * p.count_stddev] if p.adaptive else []
  return sum(z ** -2.0 for z in parts + count) ** -0.5


# high (S = 1/4), medium (1), metadata (S = 100). Metadata's PLD, at an accounted
# multiplier of 0.1, costs ~15 s of dp_accounting's discretisation (report and
# oracle) for the comparison tiers 0 and 1 make: the default suite checks its
# multipliers and noise std, `make test-slow` its PLD too.
@pytest.mark.parametrize("tier,pld", [(0, True), (1, True), (4, False),
                                      pytest.param(4, True, marks=pytest.mark.slow)])
def test_adaptive_clipping_with_tiers_is_charged_what_it_applies(tier, pld):
  # finding 1: with every feature in one tier of multiplier m, S = 1 / m^2; for S < 1 the
  # count noise sized against the base z made the pair noisier than... less noisy than charged
  x, y, parts = toy_problem(sizes=(8, 9, 10, 11, 12, 13, 14, 15, 16, 17))
  tiers = np.full(6, tier)
  from fedjax_dp.data.tabular import TIERS
  sim = toy_simulation(x, y, parts, hidden=[16], dp="central", noise_multiplier=1.0,
                       clip_parts="tiers", feature_tiers=tiers, rest_tier=TIERS[tier],
                       sampling="poisson", clients_per_round=3,
                       accountant="pld" if pld else "rdp", adaptive_clipping=True)
  m = sim.cfg.tier_noise_multipliers[tier]
  assert sim.privacy.accounted_noise_multiplier == pytest.approx(m, rel=1e-9)   # z / sqrt(S)
  assert applied_multiplier(sim) == pytest.approx(m, rel=1e-9)
  state, _ = sim.run_rounds(sim.init_state(), 5)
  report = privacy_report(sim.cfg, sim, state)
  if pld:
    assert report["pld_epsilon"] == pytest.approx(oracle([(applied_multiplier(sim), 5)],
                                                         report["q"]), rel=1e-3)
  tier_report = next(iter(report["tiers"].values()))
  assert tier_report["noise_std"] == pytest.approx(
      sim.privacy.update_noise_multiplier * sim.cfg.clip_norm * m)


def test_a_nonfinite_update_is_sent_as_zero_and_counted():
  # finding 5: one example at 3e38 made C / ||u|| NaN and the released model NaN
  x, y, parts = toy_problem(sizes=(8, 9, 10, 11))
  x = x.copy()
  x[parts[1][0]] = 3e38
  for dp in ("central", "local"):
    sim = toy_simulation(x, y, parts, dp=dp, noise_multiplier=1.0, clients_per_round=4,
                         lr=1.0)
    state, stats = sim.run_rounds(sim.init_state(), 2)
    assert all(np.all(np.isfinite(np.asarray(v))) for v in jax.tree.leaves(state.params)), dp
    assert np.asarray(stats.nonfinite).tolist() == [1, 1], dp
  kept = toy_simulation(x, y, parts, clients_per_round=4, lr=1.0, s_local=0.5,
                        index_selection="random_k", final_clip_l2=0.1, kept_noise="multiplier",
                        kept_noise_multiplier=1.0)   # dp none: TopkSDP-FL's own mechanism
  state, stats = kept.run_rounds(kept.init_state(), 2)
  assert all(np.all(np.isfinite(np.asarray(v))) for v in jax.tree.leaves(state.params))
  assert np.asarray(stats.nonfinite).tolist() == [1, 1]
  assert all(np.all(np.isfinite(np.asarray(v)))   # the residuals too
             for v in jax.tree.leaves(state.client_state["pipeline"]))
  clean = toy_simulation(*toy_problem(sizes=(8, 9, 10, 11)), dp="central", noise_multiplier=1.0,
                         clients_per_round=4)
  assert np.asarray(clean.run_rounds(clean.init_state(), 1)[1].nonfinite).tolist() == [0]


def test_the_record_composes_to_the_ledger():
  x, y, parts = toy_problem(sizes=(8, 9, 10, 11, 12, 13))
  sim = toy_simulation(x, y, parts, dp="central", noise_multiplier=1.0, sampling="poisson",
                       clients_per_round=2, noise_schedule="convergence")
  log, state = privacy_log.empty(), sim.init_state()
  for _ in range(3):
    state, stats = sim.run_rounds(state, 2)
    log = privacy_log.append(log, stats, sim.privacy.event_multipliers)
  from fedjax_dp.recipes.privacy import event_rdp
  host = privacy_log.composed_rdp(log, lambda z: event_rdp(sim.cfg, z))
  np.testing.assert_allclose(np.asarray(state.privacy.ledger, np.float64), host, rtol=1e-5)
  assert privacy_log.released_rounds(log) == 6 and len(privacy_log.round_lrs(log)) == 6


def test_secret_noise_seed_draws_the_run_key_from_the_system(tmp_path):
  x, y, parts = toy_problem()
  a = toy_simulation(x, y, parts, noise_seed="secret", dp="central", noise_multiplier=1.0)
  s1, s2 = a.init_state(), a.init_state()
  assert not np.array_equal(np.asarray(s1.key), np.asarray(s2.key))
  seeded = toy_simulation(x, y, parts, dp="central", noise_multiplier=1.0).init_state()
  for u, v in zip(jax.tree.leaves(s1.params), jax.tree.leaves(seeded.params)):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))   # the public init stays seeded
  summary = run(tmp_path / "s", rounds=2, noise_multiplier=1.0, noise_seed="secret")
  assert "noise_seed 'secret'" in summary["privacy"]["assumes"][0]
  seeded_summary = run(tmp_path / "p", rounds=2, noise_multiplier=1.0)
  assert "stay secret" in seeded_summary["privacy"]["assumes"][0]


def test_poisson_sampling_is_accounted_at_the_rate_it_draws_with():
  from fedjax_dp.privacy.mechanisms.base import poisson_rate_used
  q = 0.1
  key = jax.random.PRNGKey(3)
  u = np.asarray(jax.random.uniform(key, (1 << 16,)), np.float64)
  assert np.all(u * 2 ** 23 == np.round(u * 2 ** 23))   # the 2^-23 grid
  drawn = np.asarray(jax.random.bernoulli(key, q, (1 << 16,)))
  np.testing.assert_array_equal(drawn, u < np.float32(q))
  # P(j / 2^23 < float32(q)) by counting the grid points below it
  below = np.ceil(np.float64(np.float32(q)) * 2 ** 23)
  assert poisson_rate_used(q) == below / 2 ** 23 > q
  assert poisson_rate_used(0.5) == 0.5 and poisson_rate_used(1.0) == 1.0


def test_poisson_central_dp_publishes_expected_cohort_sizes(tmp_path):
  summary = run(tmp_path / "b", rounds=4, noise_multiplier=1.0)
  rows = [json.loads(x) for x in open(tmp_path / "b" / "metrics.jsonl")]
  per = summary["communication"]["bytes_per_client_up"]
  assert [r["bytes_up"] for r in rows] == [4 * 2 * per, 4 * 4 * per]
  assert summary["communication"]["participations"] == 16
  assert "expected" in summary["privacy"]["published_cohort_sizes"]


def test_kept_noise_is_accounted_at_the_learning_rates_the_rounds_ran_with(tmp_path):
  # finding 3: after a resume to more rounds under a cosine schedule, the earlier
  # rounds' kept noise was recomputed from the new schedule (3.26 reported, 3.57 right)
  import optax
  from fedjax_dp.models import num_params
  from fedjax_dp.experiment.reports.topksdp_privacy import topksdp_report
  over = dict(s_local=0.9, index_selection="random_k",
              final_clip_l2=0.1, kept_noise="paper", ldp_epsilon=1.0, lr=0.05,
              lr_schedule="cosine", lr_min=0.01, sampling="fixed")
  run(tmp_path / "k", rounds=4, base=NO_DP, **over)
  summary = run(tmp_path / "k", resume=True, rounds=8, base=NO_DP, **over)
  # what each round ran with: rounds 0-3 under a 4-round cosine, 4-7 under an 8-round one
  lrs = [float(optax.cosine_decay_schedule(0.05, decay_steps=r, alpha=0.2)(t))
         for r, ts in ((4, range(4)), (8, range(4, 8))) for t in ts]
  cfg = make_config({**NO_DP, **over, "rounds": 8})
  sizes = json.load(open(tmp_path / "k" / "summary.json"))["data"]["client_examples"]
  from fedjax_dp.experiment.setup import setup
  _, parts, sim = setup(cfg)
  d = num_params(jax.tree.leaves(sim.init_state().params))
  expected = topksdp_report(cfg, d, 8, [len(p) for p in parts], round_lrs=lrs)
  got = summary["privacy"]["kept_noise"]["accountant"]["epsilon"]
  assert got == pytest.approx(expected["accountant"]["epsilon"], rel=1e-6)
  stale = topksdp_report(cfg, d, 8, [len(p) for p in parts])   # today's schedule for all
  assert got > stale["accountant"]["epsilon"] * 1.01
  assert sizes["min"] == min(len(p) for p in parts)


def test_pooled_scaling_under_dp_is_listed_as_not_accounted(tmp_path):
  # finding 7: pooled standardisation lets one client's data move every client's inputs
  over = dict(dataset="breast_cancer", num_clients=10, clients_per_round=5, rounds=1,
              noise_multiplier=1.0, accountant="rdp", eval_every=1, checkpoint_every=0)
  pooled = run(tmp_path / "p", feature_scaling="pooled", **over)["privacy"]["not_accounted"]
  own = run(tmp_path / "c", **over)["privacy"]["not_accounted"]    # auto: per_client under DP
  assert any("feature_scaling 'pooled'" in x for x in pooled)
  assert not any("feature_scaling" in x for x in own)


def test_a_crashed_resume_keeps_the_mark_of_what_was_released(tmp_path):
  # audit: a resume that crashed after cutting metrics.jsonl back lost the record that
  # rounds 3-6 were released; the next resume re-ran them at another calibration
  out = tmp_path / "r"
  run(out, rounds=6, target_epsilon=8.0)
  for step in ("4", "6"):
    shutil.rmtree(out / "checkpoints" / step)
  rows = [x for x in open(out / "metrics.jsonl") if json.loads(x)["round"] <= 2]
  open(out / "metrics.jsonl", "w").writelines(rows)   # as the crashed resume left it
  os.remove(out / "summary.json")
  with pytest.raises(RunError, match="rounds up to 6 were already released"):
    run(out, resume=True, rounds=10, target_epsilon=8.0)


def test_a_secret_key_run_restarts_from_round_zero_with_its_own_key(tmp_path):
  # audit: with noise_seed secret and no checkpoint, a resume re-ran the released
  # rounds under a fresh key: a second, independent release of each
  out = tmp_path / "s"
  over = dict(rounds=4, noise_multiplier=1.0, noise_seed="secret", checkpoint_every=0)
  run(out, **over)
  first = open(out / "metrics.jsonl").read()
  assert oct(os.stat(out / "run_key.secret").st_mode & 0o777) == "0o600"
  os.remove(out / "summary.json")
  run(out, resume=True, **over)
  assert open(out / "metrics.jsonl").read().split("wall_s")[0] == first.split("wall_s")[0]
  assert ([json.loads(x)["test_loss"] for x in open(out / "metrics.jsonl")]
          == [json.loads(x)["test_loss"] for x in first.splitlines()])
  os.remove(out / "run_key.secret")
  os.remove(out / "summary.json")
  with pytest.raises(RunError, match="run_key.secret"):
    run(out, resume=True, **over)


def test_a_checkpoint_without_the_record_is_calibrated_from_its_ledger(tmp_path):
  # audit: a checkpoint whose meta lacks the log (older runs, a damaged meta) recalibrated
  # every round from zero and passed the target (2.49 for 2.0)
  out = tmp_path / "o"
  run(out, rounds=4, target_epsilon=4.0)
  for meta in (out / "checkpoints").glob("*/meta/metadata"):
    values = json.loads(meta.read_text())
    values.pop("privacy_log"), values.pop("calibration")
    meta.write_text(json.dumps(values))
  os.remove(out / "segments.jsonl")
  summary = run(out, resume=True, rounds=8, target_epsilon=4.0)["privacy"]
  assert summary["epsilon"] <= 4.0 and summary["pld_epsilon"] is None
  assert "pld_note" in summary


def test_a_run_without_checkpoints_under_a_schedule_says_it_cannot_be_extended(tmp_path):
  out = tmp_path / "c"
  over = dict(noise_multiplier=1.0, lr_schedule="cosine", lr_min=0.01, checkpoint_every=0)
  run(out, rounds=4, **over)
  with pytest.raises(RunError, match="start a new run"):
    run(out, resume=True, rounds=6, **over)


def test_the_python_api_report_checks_its_assumption_against_the_ledger():
  x, y, parts = toy_problem(sizes=(8, 9, 10, 11, 12, 13))
  common = dict(dp="central", sampling="poisson", clients_per_round=2, accountant="pld",
                rounds=10)
  sim = toy_simulation(x, y, parts, noise_multiplier=1.0, **common)
  state, _ = sim.run_rounds(sim.init_state(), 3)
  report = privacy_report(sim.cfg, sim, state)
  assert report["noise_events_source"].startswith("assumed")
  assert report["pld_epsilon"] == pytest.approx(oracle([(1.0, 3)], report["q"]), rel=1e-3)
  assert not report["stopped_by_budget"]          # 3 of 10 rounds run: nothing stopped it
  other = toy_simulation(x, y, parts, noise_multiplier=3.0, **common)
  report = privacy_report(other.cfg, other, state)   # a state this simulation did not make
  assert report["noise_events_source"].startswith("none") and report["pld_epsilon"] is None
