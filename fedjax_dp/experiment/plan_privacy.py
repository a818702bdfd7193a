"""`fedjax-dp account --config F [--set ...]`: the privacy a run config will be charged,
before running it (the first-hour review, finding 6).

The figures come from the run's own privacy set-up (recipes/privacy.make_privacy on
the config's model: the clip layout, the calibrated and accounted noise multipliers,
the mechanism's per-round event), composed over the config's rounds as the run's
ledger composes them, so that a finished run's summary.json reports the same epsilon
(tests/test_plan_privacy.py runs both). What the round's data decides (a noise
schedule, the analyzer's tiers, per-client budgets) cannot be planned and is refused
in one line."""

from __future__ import annotations

import math

from fedjax_dp.config import Config
from fedjax_dp.errors import ConfigError
from fedjax_dp.privacy import accounting
from fedjax_dp.privacy.mechanisms import get_mechanism


def _check_plannable(cfg: Config) -> None:
  mechanism = get_mechanism(cfg.dp)
  if not mechanism.private:
    raise ConfigError(f"fedjax-dp account --config: dp {cfg.dp!r} has no differential-privacy "
                      "guarantee to plan (set dp: central or local)")
  if not (mechanism.noises_sum or mechanism.noises_each_upload):
    raise ConfigError(f"fedjax-dp account --config: dp {cfg.dp!r}: its charge is not one "
                      "Gaussian per round; only central and local DP are planned")
  unplannable = [(cfg.noise_schedule != "static", f"noise_schedule {cfg.noise_schedule!r}"),
                 (cfg.clip_parts == "tiers", "clip_parts 'tiers'"),
                 (cfg.client_budgets != "uniform", f"client_budgets {cfg.client_budgets!r}")]
  for found, what in unplannable:
    if found:
      raise ConfigError(f"fedjax-dp account --config: {what}: the noise each round gets "
                        "depends on the training itself, so its epsilon cannot be planned "
                        "(the run stops at target_epsilon; its summary.json reports what it "
                        "spent)")


def _model(cfg: Config):
  """The config's built-in model (the clip layout reads its parameters)."""
  from fedjax_dp.experiment.setup import builtin_model, load_data
  if cfg.dataset == "custom" or cfg.model == "custom":
    raise ConfigError("fedjax-dp account --config: a run of your own data or model "
                      "(dataset or model 'custom') is planned from Python: "
                      "fedjax_dp.experiment.plan_privacy.plan(cfg, model)")
  return builtin_model(cfg, load_data(cfg))


def _charged_rounds(cfg: Config, event) -> int:
  """Rounds the run is charged: central DP, those budget_rounds lets it run (it stops
  before passing target_epsilon); local DP, the participations a client's own ledger
  admits when it takes part in every round."""
  from fedjax_dp.experiment.target_epsilon import budget_rounds
  last = budget_rounds(cfg)   # also the run's one-line error for an unreachable target
  if not get_mechanism(cfg.dp).per_client_ledgers or cfg.target_epsilon is None:
    return last
  # as budget_rounds' check: the float32 ledger's upward drift bounded, then <= target
  within = lambda k: accounting.epsilon_np(k * event * (1 + 2.4e-7 * k),
                                           cfg.delta)[0] <= cfg.target_epsilon
  lo, hi = 1, cfg.rounds
  if within(hi):
    return hi
  while hi - lo > 1:
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if within(mid) else (lo, mid)
  return lo


def plan(cfg: Config, model=None) -> dict:
  """The epsilon a full run of `cfg` is charged, and how: {dp, mechanism, guarantee,
  neighbouring, sampling, q, rounds, rounds_charged, noise_multiplier (and its source),
  accounted_noise_multiplier, delta, epsilon and epsilon_accountant (central: the run's;
  local: a client's that takes part in every round), rdp_epsilon, ...}. `model`: the
  run's (default: the config's built-in model)."""
  from fedjax_dp.recipes.privacy import make_privacy, sampling_rate, cohort_sampling
  _check_plannable(cfg)
  mechanism = get_mechanism(cfg.dp)
  privacy = make_privacy(cfg, model if model is not None else _model(cfg))
  z_acc = privacy.accounted_noise_multiplier
  charged = _charged_rounds(cfg, privacy.event_rdp)
  rdp_eps, order = accounting.epsilon_np(charged * privacy.event_rdp, cfg.delta)
  out = {"dp": cfg.dp, **mechanism.describe(cohort_sampling(cfg)),
         "sampling": cfg.sampling, "clients_per_round": cfg.clients_per_round,
         "num_clients": cfg.num_clients, "q": sampling_rate(cfg), "rounds": cfg.rounds,
         "rounds_charged": charged, "target_epsilon": cfg.target_epsilon,
         "noise_multiplier": privacy.noise_multiplier,
         "noise_multiplier_source": ("configured" if cfg.noise_multiplier is not None else
                                     f"calibrated to target_epsilon {cfg.target_epsilon:g}"),
         "accounted_noise_multiplier": z_acc, "delta": cfg.delta,
         "rdp_epsilon": rdp_eps, "order": order, "epsilon": rdp_eps, "epsilon_accountant": "rdp"}
  if mechanism.per_client_ledgers:
    out["epsilon_is"] = "a client's that takes part in every round"
    out["expected_participations"] = cfg.rounds * cfg.clients_per_round / cfg.num_clients
  if cfg.accountant == "pld" and math.isfinite(rdp_eps):
    _add_pld(out, cfg, z_acc, charged)
  return out


def _add_pld(out: dict, cfg: Config, z_acc: float, rounds: int) -> None:
  """PLD's figure where the run reports it (the smaller of the two is the epsilon)."""
  from fedjax_dp.errors import AccountError
  from fedjax_dp.privacy.planning import pld_epsilon_composed
  if get_mechanism(cfg.dp).per_client_ledgers or cfg.sampling != "poisson":
    return
  try:
    pld = pld_epsilon_composed(out["q"], [(z_acc, rounds)], cfg.delta)
  except AccountError as e:
    out["pld_note"] = f"no PLD figure: {e}"
    return
  out["pld_epsilon"] = pld
  if pld < out["epsilon"]:
    out["epsilon"], out["epsilon_accountant"] = pld, "pld"


def format_plan(res: dict) -> str:
  """The plan in a few lines: what is charged, the noise, the epsilon."""
  z, z_acc = res["noise_multiplier"], res["accounted_noise_multiplier"]
  lines = [f"dp {res['dp']}: {res['sampling']} cohorts of {res['clients_per_round']} of "
           f"{res['num_clients']} (q = {res['q']:.6g}), {res['rounds']} rounds; neighbours: "
           f"{res['neighbouring']}",
           f"noise multiplier {z:.6g} ({res['noise_multiplier_source']})"
           + ("" if math.isclose(z, z_acc) else f", accounted as {z_acc:.6g}")]
  if res["rounds_charged"] < res["rounds"]:
    who = "a client in every round" if "epsilon_is" in res else "the run"
    lines.append(f"target_epsilon {res['target_epsilon']:g} stops {who} after "
                 f"{res['rounds_charged']} of {res['rounds']} rounds")
  whose = " for a client that takes part in every round" if "epsilon_is" in res else ""
  other = f"; RDP {res['rdp_epsilon']:.6g}" if res["epsilon_accountant"] != "rdp" else ""
  lines.append(f"epsilon = {res['epsilon']:.6g} at delta = {res['delta']:g}{whose} "
               f"({res['epsilon_accountant'].upper()}{other}; as the run charges it)")
  return "\n".join(lines)
