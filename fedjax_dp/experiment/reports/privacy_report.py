"""The privacy report: what is guaranteed, how, and what is not covered.

The figures come from the run's record of what it released (privacy_log) and the
in-round ledger, never from today's config alone. Each part of the privacy set-up
writes its own section:

  _header             mechanism-independent facts (delta, clip, sampling, rounds)
  _clip_layout        per-layer or per-tier clipping and noise
  _central_section    DP-FedAvg: epsilon, ledger, adaptive clipping, noise events, PLD
  local_section       local DP (local_dp_report.py): per-client epsilons, budgets, PLD
  _schedule_section   the noise controller and the dynamic-DP paper's own formula

`not_accounted` comes from the release registry (releases.py): the mechanism's
influences here; a run's summary.json adds every output its folder holds that the
guarantee does not cover (summary.py).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import jax
import numpy as np

from fedjax_dp.experiment.reports import correlated_report, privacy_log
from fedjax_dp.experiment import releases
from fedjax_dp.config import Config
from fedjax_dp.placement.participation import SECRET_DRAWS
from fedjax_dp.data.registry import TABULAR
from fedjax_dp.models import num_params
from fedjax_dp.core.simulation import Simulation
from fedjax_dp.core.schedules import learning_rate_schedule
from fedjax_dp.recipes.privacy import cohort_sampling, event_rdp, sampling_rate
from fedjax_dp.privacy import accounting
from fedjax_dp.privacy.mechanisms import get_mechanism
from fedjax_dp.recipes.flat import kept_noise_of


def resolved_feature_scaling(cfg: Config) -> str:
  """cfg.feature_scaling with 'auto' resolved: 'pooled' when dp is 'none', 'per_client'
  under DP (pooled statistics would carry every client's raw data into every client's
  inputs without noise); image datasets are never standardised: 'none'."""
  if cfg.feature_scaling != "auto":
    return cfg.feature_scaling
  if cfg.dataset not in TABULAR:
    return "none"
  return "pooled" if not get_mechanism(cfg.dp).private else "per_client"


def has_guarantee(cfg: Config) -> bool:
  """Whether the run claims a guarantee: a DP mechanism, or kept noise (TopkSDP-FL)."""
  return get_mechanism(cfg.dp).private or kept_noise_of(cfg) is not None


def report_facts(cfg: Config, state) -> dict:
  """What the release registry's influences read of a run (releases.INFLUENCES)."""
  return {"pooled_scaling": has_guarantee(cfg) and resolved_feature_scaling(cfg) == "pooled",
          "cohort_overflow": int(state.cohort_overflow)}


def data_not_accounted(cfg: Config) -> list[str]:
  """The not_accounted lines the data preparation causes (none without a guarantee):
  pooled standardisation (releases.INFLUENCES)."""
  when, line = releases.INFLUENCES["pooled_scaling"]
  return [line] if when(cfg, {"pooled_scaling": has_guarantee(cfg) and
                               resolved_feature_scaling(cfg) == "pooled"}) else []


def rounds_skipped(cfg: Config, state) -> int:
  """Rounds a budget skipped inside the compiled round (they released nothing)."""
  return int(state.server_state["noise_control"]["skipped"]) if get_mechanism(cfg.dp).private else 0


def finite_or_none(x) -> float | None:
  x = float(x)
  return x if np.isfinite(x) else None


def privacy_report(cfg: Config, sim: Simulation, state, plog: dict | None = None,
                   assume: bool = True, stopped_by_budget: bool | None = None) -> dict:
  """What is guaranteed (the accountant's figure), how, and what is not accounted.

  `plog`: the run's privacy_log (what each round released). Without it, and
  `assume` (the Python API on a state that `sim` ran from round 0), every round
  is taken to have run with `sim`'s noise, which the report says; with
  `assume` False (a run resumed from a checkpoint older than the log) the
  figures that need the log are left out, also said. The assumed record is
  checked against the state's ledger: where they differ, no figure is built
  from it. `stopped_by_budget`: whether a budget ended the run before `rounds`
  (run_experiment knows; default: whether a round was skipped for it)."""
  assumed = False
  if plog is None and assume and get_mechanism(cfg.dp).private and \
      sim.privacy.schedule == "static" and not get_mechanism(cfg.dp).charged_once:
    plog = _assumed_log(cfg, sim, state)
    assumed = True
    if get_mechanism(cfg.dp).noises_sum and not _log_matches_ledger(cfg, plog, state):
      plog, assumed = None, "mismatch"
  report = _privacy_report(cfg, sim, state, plog, stopped_by_budget)
  if assumed == "mismatch":
    report["noise_events_source"] = ("none: no per-round record was given, and this "
                                     "simulation's noise does not compose to the state's ledger "
                                     "(the state did not come from it): only the ledger's "
                                     "epsilon is given")
  elif assumed:
    report["noise_events_source"] = ("assumed: no per-round record was given, so every round "
                                     "is taken to have run with this simulation's noise (it "
                                     "composes to the state's ledger)")
  if kept_noise_of(cfg) is not None:
    from fedjax_dp.experiment.reports.topksdp_privacy import topksdp_report
    d = num_params(jax.tree.leaves(state.params))
    sizes = [int(n) for n in np.asarray(sim.store.client_count)]
    # each round's noise at the learning rate it ran with (a resume may change the schedule)
    lrs = privacy_log.round_lrs(plog) if plog is not None else None
    report["kept_noise"] = topksdp_report(cfg, d, int(state.round), sizes, round_lrs=lrs)
    if not get_mechanism(cfg.dp).private:
      report["note"] = ("no user-level DP (dp none); the client-side noise on kept coordinates "
                        "is reported under kept_noise")
      report["not_accounted"] = releases.not_accounted(cfg, None, report_facts(cfg, state))
  if has_guarantee(cfg):
    report["assumes"] = assumptions(cfg)
  _set_headline(cfg, report)
  return report


def _set_headline(cfg: Config, report: dict) -> None:
  """The run's one guarantee at the top of the report: epsilon (at delta) and the
  accountant it came from, or epsilon_why_none in one line. dp none with kept noise
  that has a complete guarantee: the kept-noise per-client figure."""
  kept = report.get("kept_noise", {}).get("accountant", {})
  if not get_mechanism(cfg.dp).private and kept.get("epsilon") is not None:
    report.update(epsilon=finite_or_none(kept["epsilon"]), delta=kept["delta"],
                  epsilon_accountant="rdp, kept noise per client")
  elif get_mechanism(cfg.dp).private:
    report.setdefault("epsilon_accountant", "rdp")
  why = None
  if report.get("epsilon") is None:
    if not get_mechanism(cfg.dp).private and kept_noise_of(cfg) is None:
      why = "dp none: no noise is added, so the run has no differential-privacy guarantee"
    elif not get_mechanism(cfg.dp).private:
      reasons = "; ".join(report["kept_noise"]["not_accounted"]) or "no round ran"
      why = f"the kept noise has no complete guarantee: {reasons}"
    elif report.get("noise_multiplier") == 0:
      why = "noise_multiplier 0: no noise, epsilon is infinite"
    else:
      why = "the accountant's epsilon is infinite at this delta"
    report["epsilon_accountant"] = None
  report["epsilon_why_none"] = why


def headline(report: dict) -> dict:
  """A privacy report's one guarantee, as metrics.jsonl rows carry it."""
  return {"epsilon": report.get("epsilon"), "delta": report.get("delta"),
          "epsilon_accountant": report.get("epsilon_accountant")}


def mark_test_mode(report: dict, why: str | None) -> dict:
  """`report` with no epsilon where the rounds did not apply the noise the accountant
  charged (the audit's --undercharge test mode, `why` its one line, else None: the
  report as it is): its figures are then no guarantee. The ledger stays, as charged."""
  if why is not None:
    for key in ("epsilon", "rdp_epsilon", "pld_epsilon", "client_epsilons",
                "epsilon_accountant"):
      if key in report:
        report[key] = None
    for key in ("epsilon_min", "epsilon_median", "epsilon_max"):
      if key in report.get("clients", {}):
        report["clients"][key] = None
    report.update(epsilon_why_none=why, test_mode=why)
  return report


def _log_matches_ledger(cfg: Config, plog: dict, state) -> bool:
  """The record's RDP against the in-round ledger (float32, rounded up by at most
  ~2.4e-7 per round): equal to that rounding, where the ledger is finite."""
  host = privacy_log.composed_rdp(plog, lambda z: event_rdp(cfg, z))
  ledger = np.asarray(state.privacy.ledger, np.float64)
  ok = np.isfinite(ledger) & np.isfinite(host)
  return bool(np.all(np.isfinite(ledger) == np.isfinite(host))
              and np.allclose(ledger[ok], host[ok], rtol=1e-5, atol=1e-7))


def _assumed_log(cfg: Config, sim: Simulation, state) -> dict:
  """A privacy_log of `state`'s rounds all at `sim`'s static noise (and lr schedule)."""
  released = (int(state.round) - rounds_skipped(cfg, state)
              if get_mechanism(cfg.dp).noises_sum else 0)
  lr_at = learning_rate_schedule(cfg.lr_schedule, cfg.lr, cfg.lr_min, cfg.rounds)
  stats = dict(event=np.zeros(released, np.int32),
               lr=np.asarray([lr_at(t) for t in range(int(state.round))], np.float32),
               nonfinite=0)
  return privacy_log.append(privacy_log.empty(), SimpleNamespace(**stats),
                            sim.privacy.event_multipliers)


def assumptions(cfg: Config) -> list[str]:
  """What every guarantee of the run takes for granted about things outside it."""
  seed = ("noise_seed 'secret': the noise and cohort keys come from the operating system's "
          "entropy and are not in config.json; the run folder's run_key.secret (written with "
          "or without checkpoints, for a restart from round 0) and the checkpoints hold the "
          "run key and so must stay as secret as the noise (delete run_key.secret once the run "
          "will not be restarted)" if cfg.noise_seed == "secret" else
          f"the seed ({cfg.seed}, in config.json: publish it without its seed) and the "
          "checkpoints stay secret: every noise draw and cohort is a function of the seed and "
          "of the release's settings and data, which an adversary is assumed to know, so "
          "anyone who has the seed can test a guess of the data by subtracting the noise from "
          "a released model (noise_seed 'secret' draws the keys from the operating system "
          "instead)")
  same = ("every run draws its own keys: two runs on the same data are two releases, and "
          "their epsilons compose" if cfg.noise_seed == "secret" else
          "releases of the same settings, data and seed are one release: they draw the same "
          "cohorts and noise and publish the same numbers (a rerun reproduces, it does not "
          "compose); releases whose settings or data differ in anything (sweep cells "
          "included) draw their own, and their epsilons compose")
  return [seed, same,
          "the checkpoints also hold unnoised per-client state (error-feedback residuals, "
          "control variates, local models, per-client ledgers) and the unnoised diagnostics: "
          "they are the server's private working state, not releases"]


def add_pld(report: dict, compute: Callable[[], float], accountant: str) -> None:
  """PLD's figure beside the RDP one (kept as rdp_epsilon), the smaller as epsilon
  (and epsilon_accountant); if PLD cannot be had (too little noise for its
  discretisation) the RDP figure stands, and the report says why."""
  from fedjax_dp.errors import AccountError
  try:
    report["pld_epsilon"] = compute()
  except AccountError as e:
    report["pld_epsilon"] = None
    report["pld_note"] = f"no PLD figure: {e}; epsilon is the RDP accountant's"
    return
  report["accountant"] = accountant
  report["rdp_epsilon"] = report["epsilon"]
  if report["epsilon"] is None or report["pld_epsilon"] < report["epsilon"]:
    report["epsilon"], report["epsilon_accountant"] = report["pld_epsilon"], "pld"


def _privacy_report(cfg: Config, sim: Simulation, state, plog: dict | None,
                    stopped_by_budget: bool | None = None) -> dict:
  if not get_mechanism(cfg.dp).private:
    return {"dp": "none", "epsilon": None, "delta": None,
            "note": "no noise is added: this run has no differential-privacy guarantee"}
  skipped = rounds_skipped(cfg, state)
  rounds = int(state.round) - skipped   # rounds that ran (skipped ones released nothing)
  if plog is not None and get_mechanism(cfg.dp).noises_sum:
    assert privacy_log.released_rounds(plog) == rounds, (plog, rounds)
  report = _header(cfg, sim, rounds)
  report.update(_clip_layout(cfg, sim))
  if get_mechanism(cfg.dp).noises_sum:
    _central_section(report, cfg, sim, state, plog, rounds, skipped, stopped_by_budget)
  else:
    from fedjax_dp.experiment.reports.local_dp_report import local_section
    local_section(report, cfg, sim, state)
    # every client's budget spent before `rounds` (the run stopped: the audit's finding)
    report["stopped_by_budget"] = bool(stopped_by_budget)
  report.update(_schedule_section(cfg, sim, state))
  # the mechanism's influences; a run's summary adds what its folder publishes (summary.py)
  report["not_accounted"] = releases.not_accounted(cfg, None, report_facts(cfg, state))
  if sim.noise_multiplier == 0:
    report["note"] = "noise_multiplier 0: no differential-privacy guarantee (epsilon infinite)"
  return report


def _header(cfg: Config, sim: Simulation, rounds: int) -> dict:
  return {
      "dp": cfg.dp, "delta": cfg.delta, "noise_multiplier": sim.noise_multiplier,
      "noise_multiplier_source": "configured" if cfg.noise_multiplier is not None
                                 else f"calibrated to target_epsilon {cfg.target_epsilon:g}",
      "clip_norm": cfg.clip_norm, "clip_parts": cfg.clip_parts,
      "sampling": cfg.sampling, "rounds_accounted": rounds,
      # the rate amplification by sampling charges (none for correlated noise)
      **({} if get_mechanism(cfg.dp).charged_once else {"q": sampling_rate(cfg)}),
      "target_epsilon": cfg.target_epsilon,
      "accountant": "rdp (in-round ledger, dp-accounting's default orders)",
  }


def _clip_layout(cfg: Config, sim: Simulation) -> dict:
  layout = sim.privacy.layout
  if cfg.clip_parts == "per_layer":
    return {"part_clip_norms": {n: f * cfg.clip_norm for n, f in zip(layout.names,
                                                                     layout.fractions)},
            "clip_parts_note": (
                "each layer clipped to clip_norm * sqrt(size / total), isotropic noise: the "
                "parts compose to one Gaussian with the same noise multiplier")}
  if cfg.clip_parts != "tiers":
    return {}
  z_u = sim.privacy.update_noise_multiplier   # z, raised by adaptive clipping's count
  return {
      "tiers": {name: {"clip_norm": f * cfg.clip_norm, "noise_std": z_u * cfg.clip_norm * m,
                       "noise_multiplier": z_u * m / f}
                for name, f, m in zip(layout.names, layout.fractions, layout.noise_scales)},
      "effective_noise_multiplier": sim.privacy.accounted_noise_multiplier,
      "clip_parts_note": (
          "each tier clipped on its own to clip_norm * sqrt(size / total) and noised with std "
          "noise_multiplier * clip_norm * its tier multiplier; the tiers are Gaussians on the "
          "same record, so their RDP adds (one Gaussian with the effective noise multiplier), "
          f"it does not take the maximum. First-layer rows take their feature's tier; every "
          f"other parameter takes rest_tier {cfg.rest_tier!r}")}


def _central_section(report: dict, cfg: Config, sim: Simulation, state, plog, rounds: int,
                     skipped: int, stopped_by_budget) -> None:
  z = sim.noise_multiplier
  eps, order = sim.epsilons(state)
  report.update({
      **get_mechanism(cfg.dp).describe(cohort_sampling(cfg)),
      "epsilon": finite_or_none(eps),
      "order": float(order) if finite_or_none(eps) is not None else None,
      "ledger": {"is": "the accountant's state: the RDP of the rounds released, at each "
                       "order (epsilon is its conversion at delta)",
                 "orders": [float(a) for a in accounting.DEFAULT_ORDERS],
                 "rdp": np.asarray(state.privacy.ledger, np.float64).tolist()},
      "stopped_by_budget": (skipped > 0 if stopped_by_budget is None
                            else bool(stopped_by_budget)),
      "rounds_skipped_by_budget": skipped,
  })
  if cfg.adaptive_clipping:
    report["adaptive_clipping"] = {
        "method": "Andrew et al. 2021, geometric update to a target quantile",
        "target_quantile": cfg.target_quantile, "clip_lr": cfg.clip_lr,
        "count_stddev": sim.privacy.count_stddev,
        "update_noise_multiplier": sim.privacy.update_noise_multiplier,
        "accounted_noise_multiplier": sim.privacy.accounted_noise_multiplier,
        "final_clip_norm": float(state.privacy.clip_norm),
        "note": ("the noised clipped-count query is accounted: the updates' noise "
                 "(update_noise_multiplier on each clip part) and the count's (count_stddev, "
                 "sensitivity 1/2) compose to one Gaussian with accounted_noise_multiplier"
                 if sim.privacy.strategy is None else correlated_report.count_note(sim))}
  # a correlated-noise run is one Gaussian charged in shares: no per-round events
  once = get_mechanism(cfg.dp).charged_once
  if once:
    report["correlated_noise"] = correlated_report.correlated_section(cfg, sim, rounds)
    if cfg.accountant == "pld" and z > 0 and rounds > 0:
      add_pld(report, lambda: correlated_report.correlated_pld(cfg, sim, rounds),
              "rdp ledger in the round; final figure by dp-accounting's PLD of " + (
                  "the participations' subsampled Gaussians" if sim.privacy.strategy.sampled
                  else "the one Gaussian"))
  events = privacy_log.noise_events(plog) if plog is not None and not once else None
  if events is not None:
    report["noise_events"] = [{"accounted_noise_multiplier": m, "rounds": n}
                              for m, n in events]
    if len({m for m, _ in events}) > 1:
      report["noise_events_note"] = (
          "the rounds ran at different accounted multipliers (a noise schedule, or a resume "
          "that calibrated the rounds after it to what was left of target_epsilon); every "
          "figure composes each round at its own")
  if cfg.accountant == "pld" and z > 0 and rounds > 0 and not once:
    if events is None:
      report["pld_epsilon"] = None
      report["pld_note"] = ("no PLD figure: the run resumed from a checkpoint without the "
                            "per-round record; epsilon is the RDP ledger's")
    else:
      from fedjax_dp.privacy.planning import pld_epsilon_composed
      # each released round's composed multiplier (tiers: less than z), as the ledger charges
      add_pld(report, lambda: pld_epsilon_composed(sampling_rate(cfg), events, cfg.delta),
              "rdp ledger in the round; final figure by dp-accounting's PLD")
  if cfg.sampling == "poisson" and not once:   # (correlated noise: its section says its q)
    report["q_configured"] = cfg.clients_per_round / cfg.num_clients
    report["q_note"] = ("q is the rate the sampler really draws with (float32 "
                        "uniforms on a 2^-23 grid), which the accountant charges")
  if cfg.sampling in SECRET_DRAWS:
    report["published_cohort_sizes"] = (
        "expected only: bytes_up, bytes_down and participations count clients_per_round per "
        "round, and unclipped_fraction is over that expected cohort (so it can pass 1); the "
        "realised Poisson cohort sizes depend on who is in the data" + (
            "" if cfg.sampling == "poisson" else
            " and tell about who was drawn, which the amplified accountant takes as secret"))


def uses_dynamic_dp(cfg: Config) -> bool:
  """A run with one of the dynamic-DP paper's options (a noise schedule, sensitivity
  tiers, allocated budgets): only there is the paper's own formula reported beside
  the guarantee (in a plain DP-FedAvg run it was a 494 beside a 7.1: the first-hour
  review, finding 7)."""
  return (cfg.noise_schedule != "static" or cfg.clip_parts == "tiers"
          or cfg.client_budgets == "allocated")


def _schedule_section(cfg: Config, sim: Simulation, state) -> dict:
  """The noise controller's settings and the dynamic-DP paper's own figure (central
  DP; local DP's per-client one is in local_dp_report.local_section)."""
  nc = state.server_state["noise_control"]
  out = {}
  if get_mechanism(cfg.dp).noises_sum and sim.noise_multiplier > 0 and uses_dynamic_dp(cfg):
    out["paper_formula_epsilon"] = {
        "is": "NOT a guarantee: the dynamic-DP paper's per-round charge "
              "sqrt(2 ln(1.25/delta)) / z_round summed over the rounds run (no sampling, "
              "needs epsilon < 1 per round, ignores delta)",
        "total": float(nc["paper_epsilon_rounds"])}
  if cfg.noise_schedule != "static":
    out["noise_schedule"] = {
        "schedule": cfg.noise_schedule, "measure": cfg.convergence_measure,
        "lambda": cfg.convergence_lambda, "window": cfg.convergence_window,
        "beta": cfg.convergence_beta, "ema": cfg.noise_ema,
        "final_score": float(nc["score"]),
        "note": "each round's noise is set before the round from earlier released global "
                "updates (public), and the ledgers compose every round at its actual noise"}
  return out
