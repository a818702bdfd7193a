"""Hyperparameters as data (issue 19 item 3): a changed numeric hyperparameter runs on
the same compiled round and gives what a simulation built with it gives."""

import jax
import numpy as np
import pytest

from fedjax_dp.errors import ConfigError
from tests.helpers import make_test_runs, toy_problem, toy_simulation
from tests.test_golden import FEATURE_TIERS

CASES = {
    "fedavgm_cosine": (dict(algorithm="fedavgm", lr_schedule="cosine", lr_min=0.01, rounds=4),
                       dict(lr=0.05, lr_min=0.02, momentum=0.3, server_lr=0.7,
                            server_momentum=0.5)),
    "central_adaptive": (dict(dp="central", noise_multiplier=1.0, adaptive_clipping=True,
                              clients_per_round=4, sampling="poisson", max_cohort=6),
                         dict(noise_multiplier=0.6, clip_norm=0.3, target_quantile=0.7,
                              clip_lr=0.4, delta=1e-6)),
    "central_schedule_target": (dict(dp="central", target_epsilon=20.0, rounds=4,
                                     noise_schedule="convergence", clients_per_round=4,
                                     sampling="poisson", max_cohort=6),
                                dict(target_epsilon=9.0, convergence_beta=0.5,
                                     convergence_lambda=0.3, noise_ema=0.5)),
    "local_budget": (dict(dp="local", noise_multiplier=2.0, target_epsilon=25.0,
                          clients_per_round=4),
                     dict(noise_multiplier=1.2, target_epsilon=15.0, clip_norm=0.5)),
    "terms_and_rule": (dict(algorithm="contrastive+fedadmm+fedprox", aggregator="trimmed_mean",
                            byzantine_fraction=0.2, rounds=4),
                       dict(contrastive_mu1=0.05, contrastive_mu2=0.02, contrastive_radius=0.5,
                            admm_rho=0.3, prox_mu=0.2, trim_fraction=0.3)),
    "moon_feddyn_geomed": (dict(algorithm="moon+feddyn", aggregator="geometric_median",
                                clients_per_round=4),
                           dict(moon_mu=0.5, moon_tau=0.25, feddyn_alpha=0.1,
                                geomed_eps=1e-4)),
    # the upload stages' clips and kept noise (compression/pipeline.py)
    "upload_clips": (dict(s_local=0.5, coordinate_clip=0.5, update_clip_l2=2.0,
                          final_clip_l2=1.0),
                     dict(coordinate_clip=0.3, update_clip_l2=1.0, final_clip_l2=0.5)),
    "kept_noise": (dict(s_local=0.5, final_clip_l2=0.5, kept_noise="multiplier",
                        kept_noise_multiplier=0.5),
                   dict(kept_noise_multiplier=1.0, final_clip_l2=0.3)),
    "kept_noise_paper_clip": (dict(s_local=0.5, update_clip_l2=1.0, kept_noise="paper",
                                   ldp_epsilon=5.0),
                              dict(update_clip_l2=0.5)),
    "multi_krum_counts": (dict(aggregator="multi_krum", byzantine_f=0, multi_krum_m=2),
                          dict(byzantine_f=1, multi_krum_m=3)),
    "geomed_iters": (dict(aggregator="geometric_median", clients_per_round=4),
                     dict(geomed_iters=3)),
    "cclip_iters": (dict(aggregator="centered_clip"), dict(cclip_iters=2, cclip_tau=0.5)),
    # the threshold whose clusters set next round's per-cluster noise
    "cluster_noise_threshold": (dict(dp="local", noise_multiplier=1.0, aggregator="cluster",
                                     cluster_noise="equalize", clients_per_round=4),
                                dict(cluster_threshold=0.3)),
    "central_tiers": (dict(dp="central", noise_multiplier=1.0, clip_parts="tiers",
                           clients_per_round=4),
                      dict(tier_noise_multipliers=(3.0, 1.5, 1.0, 0.5, 0.2))),
}


def _leaves(tree):
  return [np.asarray(a) for a in jax.tree.leaves(tree)]


# `make test` keeps one case of each code path; the others run in `make test-slow` (CI runs both)
@pytest.mark.parametrize("name", make_test_runs(sorted(CASES), {
    "central_adaptive", "kept_noise_paper_clip", "local_budget", "moon_feddyn_geomed",
    "upload_clips"}))
def test_changed_hyperparameters_reuse_the_compiled_round_and_match_a_fresh_build(name):
  base, change = CASES[name]
  x, y, parts = toy_problem(sizes=(7, 12, 3, 9, 5, 8))
  tiers = FEATURE_TIERS if base.get("clip_parts") == "tiers" else None
  sim = toy_simulation(x, y, parts, feature_tiers=tiers, **base)
  state, _ = sim.run_rounds(sim.init_state(), 2)         # compiles once
  hp = sim.hparams_for(**change)
  start = sim.init_state(hp)
  got, got_stats = sim.run_rounds(start, 2, hparams=hp)
  assert sim.run_chunk._cache_size() == 1                # no recompilation

  fresh = toy_simulation(x, y, parts, feature_tiers=tiers, **{**base, **change})
  want, want_stats = fresh.run_rounds(fresh.init_state(), 2)
  for a, b in zip(_leaves(got) + _leaves(got_stats), _leaves(want) + _leaves(want_stats)):
    np.testing.assert_array_equal(a, b)
  # the accountant charged the new noise: the ledger moved with it (a new cluster
  # threshold moves the noise only where the clusters change)
  assert not np.array_equal(np.asarray(got.privacy.ledger), np.asarray(state.privacy.ledger)) or \
      sim.cfg.dp == "none" or "cluster_threshold" in change
  assert sim.privacy_for(**change).event_multipliers == fresh.privacy.event_multipliers
  # with_hparams: the same compiled round, and the host's view (config, privacy, epsilons)
  # follows the new values
  moved = sim.with_hparams(**change)
  assert moved.run_chunk is sim.run_chunk and moved.cfg == fresh.cfg
  again, _ = moved.run_rounds(moved.init_state(), 2)
  for a, b in zip(_leaves(again), _leaves(want)):
    np.testing.assert_array_equal(a, b)
  assert sim.run_chunk._cache_size() == 1
  if fresh.cfg.dp != "none":
    np.testing.assert_array_equal(moved.epsilons(again)[0], fresh.epsilons(want)[0])


def test_a_changed_learning_rate_changes_the_result():
  # the values really are read from the data: a changed lr is not ignored
  x, y, parts = toy_problem()
  sim = toy_simulation(x, y, parts)
  a, _ = sim.run_rounds(sim.init_state(), 1)
  # the same draws, to see the lr alone (its own release would draw its own)
  b, _ = sim.run_rounds(sim.init_state(), 1, hparams=sim.hparams_for(lr=0.2), same_draws=True)
  assert not np.array_equal(_leaves(a.params)[0], _leaves(b.params)[0])


def test_with_seed_alone_is_a_fresh_build_at_that_seed():
  # the model's initialisation, cohorts, training and noise all follow the seed; the
  # data stays the one built (data_seed pinned): with_seed once kept the old
  # set-up, so a reseeded simulation initialised the model from the first seed
  x, y, parts = toy_problem(sizes=(7, 12, 3, 9, 5, 8))
  base = dict(dp="central", noise_multiplier=1.0, clients_per_round=4, seed=1)
  sim = toy_simulation(x, y, parts, **base)
  moved = sim.with_seed(5)
  assert moved.run_chunk is sim.run_chunk and moved.setup.seed == 5
  fresh = toy_simulation(x, y, parts, **{**base, "seed": 5, "data_seed": 1})
  assert moved.cfg == fresh.cfg
  got, got_stats = moved.run_rounds(moved.init_state(), 2)
  want, want_stats = fresh.run_rounds(fresh.init_state(), 2)
  for a, b in zip(_leaves(got) + _leaves(got_stats), _leaves(want) + _leaves(want_stats)):
    np.testing.assert_array_equal(a, b)
  first, _ = sim.run_rounds(sim.init_state(), 2)
  assert not np.array_equal(_leaves(first.params)[0], _leaves(got.params)[0])
  # the same numbers issued at both seeds name two releases: init_state(hparams) of
  # each is its own seed's (keys and model), whichever was issued last
  hp5 = moved.hparams_for(lr=0.2)
  hp1 = sim.hparams_for(lr=0.2)
  fresh5 = toy_simulation(x, y, parts, **{**base, "seed": 5, "data_seed": 1, "lr": 0.2})
  fresh1 = toy_simulation(x, y, parts, **{**base, "lr": 0.2})
  for s, hp, want in ((moved, hp5, fresh5), (sim, hp1, fresh1)):
    start = s.init_state(hp)
    for a, b in zip(_leaves(start), _leaves(want.init_state())):
      np.testing.assert_array_equal(a, b)
    s.run_rounds(start, 1, hparams=hp)   # its own release: accepted
  with pytest.raises(ConfigError, match="another release's"):
    moved.run_rounds(sim.init_state(hp1), 1, hparams=hp5)


@pytest.mark.parametrize("change, message", [
    (dict(num_clients=5), "num_clients shape the compiled round"),
    (dict(momentum=0.0), "momentum 0.5 -> 0.0 changes the compiled round's structure"),
    (dict(lr=-1.0), "lr"),
    (dict(update_clip_l2=0.5), "update_clip_l2 None -> 0.5 changes the compiled round's structure"),
])
def test_structural_or_bad_changes_are_refused(change, message):
  x, y, parts = toy_problem()
  sim = toy_simulation(x, y, parts)
  with pytest.raises(ConfigError, match=message) as e:
    sim.hparams_for(**change)
  assert "\n" not in str(e.value)


def test_scaffold_refuses_a_changed_client_momentum():
  x, y, parts = toy_problem()
  sim = toy_simulation(x, y, parts, algorithm="scaffold")
  with pytest.raises(ConfigError, match="SCAFFOLD"):
    sim.hparams_for(momentum=0.3)


def test_a_batch_of_hyperparameters_vmaps_over_the_compiled_chunk():
  # the sweeps issue builds on this: replicas differing only in numbers as one program
  import jax.numpy as jnp
  x, y, parts = toy_problem()
  sim = toy_simulation(x, y, parts, dp="central", noise_multiplier=1.0)
  hps = [sim.hparams_for(lr=0.05, noise_multiplier=2.0), sim.hparams_for(lr=0.2)]
  batch = jax.tree.map(lambda *a: jnp.stack(a), *hps)
  states = jax.tree.map(lambda *a: jnp.stack(a), *[sim.init_state(hp) for hp in hps])
  out, stats = jax.jit(jax.vmap(lambda s, hp: sim.run_chunk(s, sim.store, hp, 2)))(states, batch)
  for i, hp in enumerate(hps):
    one, one_stats = sim.run_rounds(sim.init_state(hp), 2, hparams=hp)   # each its own key
    for a, b in zip(_leaves(one.params), _leaves(out.params)):
      np.testing.assert_allclose(b[i], a, rtol=0, atol=1e-6)   # batched matmuls round apart
    np.testing.assert_array_equal(np.asarray(out.privacy.ledger)[i], np.asarray(one.privacy.ledger))


def test_an_edited_pytree_is_refused():
  # the applied noise and the charged RDP are separate entries: an edited copy could
  # lower the noise while the ledger charges the old one
  x, y, parts = toy_problem()
  sim = toy_simulation(x, y, parts, dp="central", noise_multiplier=2.0)
  hp = sim.hparams_for(noise_multiplier=1.5)
  sim.run_rounds(sim.init_state(hp), 1, hparams=hp)             # made here: runs
  hp["update_noise"] = np.float32(0.2)
  with pytest.raises(ConfigError, match="not made by this simulation"):
    sim.run_rounds(sim.init_state(), 1, hparams=hp, same_draws=True)


@pytest.mark.parametrize("base, change, message", [
    (dict(), dict(prox_mu=0.5), "'prox_mu' = 0.5 is read by nothing in this run: it is read "
                                 "with algorithm 'fedprox'"),
    (dict(aggregator="median"), dict(cclip_tau=2.0), "cclip_tau"),
    (dict(dp="central", noise_multiplier=1.0), dict(clip_count_stddev=2.0),
     "'clip_count_stddev' = 2.0 is read by nothing in this run: it is read with "
     "adaptive_clipping true"),
    (dict(lr_schedule="constant"), dict(lr_min=0.01), "lr_min"),
    (dict(dp="local", noise_multiplier=1.0, target_epsilon=20.0), dict(target_epsilon=5.0),
     "per-client budgets"),
    (dict(s_local=0.5, final_clip_l2=0.1, kept_noise="paper", ldp_epsilon=5.0), dict(lr=0.05),
     "calibrates its noise to the learning rate"),
])
def test_overrides_the_round_would_ignore_or_could_not_account_are_refused(base, change, message):
  x, y, parts = toy_problem()
  sim = toy_simulation(x, y, parts, **base)
  if "target_epsilon" in base:   # per-client budgets, as allocated budgets give
    from fedjax_dp.core.build import build_simulation
    from fedjax_dp.recipes.plan import plan_run
    sim = build_simulation(plan_run(sim.cfg, sim.model,
                                    client_budgets=np.array([20.0, 15.0, 25.0])),
                           sim.model, sim.store, sim.mesh)
  with pytest.raises(ConfigError, match=message) as e:
    sim.with_hparams(**change)
  assert "\n" not in str(e.value)


def test_local_pld_is_not_reported_at_another_simulations_noise():
  # rounds run with less noise than the reporting simulation's must not get its PLD figure
  from fedjax_dp.experiment.reports.privacy_report import privacy_report
  x, y, parts = toy_problem()
  sim = toy_simulation(x, y, parts, dp="local", noise_multiplier=8.0, accountant="pld")
  quiet = sim.with_hparams(noise_multiplier=1.0)
  state, _ = quiet.run_rounds(quiet.init_state(), 3)
  wrong = privacy_report(sim.cfg, sim, state)
  assert wrong["pld_epsilon"] is None and "other hyperparameters" in wrong["pld_note"]
  assert wrong["epsilon"] == pytest.approx(float(np.max(sim.epsilons(state)[0])))
  right = privacy_report(quiet.cfg, quiet, state)
  assert right["pld_epsilon"] is not None and right["epsilon"] <= float(
      np.max(quiet.epsilons(state)[0]))


def test_downlink_residual_is_kept_through_a_round_the_server_does_not_apply():
  # a skipped central-DP round (budget) sends nothing down: its error-feedback residual
  # must not lose the top-k of what it owed
  x, y, parts = toy_problem(sizes=(7, 12, 3, 9, 5, 8))
  from tests.test_golden import FEATURE_TIERS
  sim = toy_simulation(x, y, parts, dp="central", noise_multiplier=10.0, target_epsilon=4.5,
                       clip_parts="tiers", clients_per_round=3, s_global=0.5, rounds=4,
                       feature_tiers=FEATURE_TIERS)
  state, stats = sim.run_rounds(sim.init_state(), 2)
  assert list(np.asarray(stats.event)) == [0, 0]
  before = np.asarray(state.server_state["downlink_residual"])
  state, stats = sim.run_rounds(state, 2)
  assert list(np.asarray(stats.event)) == [-1, -1]           # both skipped by the budget
  np.testing.assert_array_equal(np.asarray(state.server_state["downlink_residual"]), before)
