"""`fedjax-dp account --config F [--set ...]`: the privacy a run config will be charged,
before running it (the first-hour review, finding 6).

The figures come from the run's own privacy set-up (recipes/privacy.make_privacy on
the config's model and data: the clip layout, the calibrated and accounted noise
multipliers, the mechanism's per-round event), composed as the run's float32 ledger
composes them (accounting.compose, rounding up at every step) and stopped where the
run stops (budget_rounds, or the in-round check against the budget), so that a
finished run's summary.json reports the same epsilon (tests/test_plan_privacy.py runs
both). Correlated noise (tree, BandMF, BLT) is one Gaussian over the run, charged in
the strategy's shares. What the round's data decides (a noise schedule, the analyzer's tiers,
per-client budgets or per-cluster noise) cannot be planned and is refused in one line."""

from __future__ import annotations

import math

import numpy as np

from fedjax_dp.config import Config
from fedjax_dp.errors import ConfigError
from fedjax_dp.privacy import accounting
from fedjax_dp.privacy.mechanisms import get_mechanism


def _check_plannable(cfg: Config) -> None:
  from fedjax_dp.recipes.flat import kept_noise_of
  mechanism = get_mechanism(cfg.dp)
  if not mechanism.private:
    kept = kept_noise_of(cfg)
    raise ConfigError(
        f"fedjax-dp account --config: dp {cfg.dp!r}: " + (
            f"kept noise {kept.name!r} is accounted by the run itself (its summary.json "
            "reports it); account --config plans dp central and local" if kept else
            "no differential-privacy guarantee to plan (set dp: central or local)"))
  if not (mechanism.noises_sum or mechanism.noises_each_upload):
    raise ConfigError(f"fedjax-dp account --config: dp {cfg.dp!r}: its charge is not one "
                      "Gaussian per round; only central and local DP are planned")
  unplannable = [(cfg.noise_schedule != "static", f"noise_schedule {cfg.noise_schedule!r}"),
                 (cfg.tier_source == "analyzer" and cfg.clip_parts == "tiers",
                  "tier_source 'analyzer'"),
                 (cfg.client_budgets != "uniform", f"client_budgets {cfg.client_budgets!r}"),
                 (cfg.cluster_noise != "uniform", f"cluster_noise {cfg.cluster_noise!r}")]
  for found, what in unplannable:
    if found:
      raise ConfigError(f"fedjax-dp account --config: {what}: the noise each round gets "
                        "depends on the training itself, so its epsilon cannot be planned "
                        "(the run stops at target_epsilon; its summary.json reports what it "
                        "spent)")


def _model_and_tiers(cfg: Config):
  """The config's built-in model (the clip layout reads its parameters) and its data's
  sensitivity tiers (clip_parts 'tiers')."""
  from fedjax_dp.experiment.setup import builtin_model, load_data
  if cfg.dataset == "custom" or cfg.model == "custom":
    raise ConfigError("fedjax-dp account --config: a run of your own data or model "
                      "(dataset or model 'custom') is planned from Python: "
                      "fedjax_dp.experiment.plan_privacy.plan(cfg, model)")
  ds = load_data(cfg)
  return builtin_model(cfg, ds), ds.feature_tiers


def _ledger(cfg: Config, event, rounds: int, limit: float | None) -> tuple[np.ndarray, int]:
  """(the ledger [orders] after `rounds` compositions of `event`, as the round adds them,
  stopping before one whose epsilon would pass `limit`; the compositions made)."""
  import jax
  import jax.numpy as jnp
  event32 = jnp.asarray(accounting.event_to_float32(event))

  def go(count, limit):
    def more(carry):
      k, ledger = carry
      ok = k < count
      if limit is not None:
        after = accounting.compose(ledger, event32)
        ok = ok & (accounting.epsilon(after, cfg.delta)[0] <= limit)
      return ok
    step = lambda carry: (carry[0] + 1, accounting.compose(carry[1], event32))
    return jax.lax.while_loop(more, step, (jnp.int32(0), jnp.zeros_like(event32)))
  k, ledger = jax.jit(go, static_argnums=1)(rounds, limit)
  return np.asarray(ledger, np.float64), int(k)


def _shares_ledger(event, charges) -> np.ndarray:
  """The ledger [orders] of a correlated-noise run (privacy/mechanisms/correlated.py):
  round t composes event x charges[t], in float32, as its round does."""
  import jax
  import jax.numpy as jnp
  event32 = jnp.asarray(accounting.event_to_float32(event))
  shares = jnp.asarray(charges, jnp.float32)
  step = lambda ledger, share: (accounting.compose(ledger, event32 * share), None)
  ledger, _ = jax.jit(lambda s: jax.lax.scan(step, jnp.zeros_like(event32), s))(shares)
  return np.asarray(ledger, np.float64)


def _charged(cfg: Config, privacy) -> tuple[np.ndarray, int]:
  """The ledger a full run of `cfg` ends with, and its compositions (rounds released,
  or a client's participations in every round): central DP stops where budget_rounds
  says (or, checked in the round, before passing the budget); local DP's client is
  refused the participation that would pass its budget."""
  from fedjax_dp.experiment.target_epsilon import budget_rounds
  from fedjax_dp.recipes.hparams import budget_limit
  last = budget_rounds(cfg)   # also the run's one-line error for an unreachable target
  if get_mechanism(cfg.dp).charged_once:
    return _shares_ledger(privacy.event_rdp, privacy.strategy.charges), last
  in_round = (get_mechanism(cfg.dp).per_client_ledgers or privacy.stop_in_round)
  limit = (float(budget_limit(cfg.target_epsilon))
           if in_round and cfg.target_epsilon is not None else None)
  return _ledger(cfg, privacy.event_rdp, last, limit)


def plan(cfg: Config, model=None) -> dict:
  """The epsilon a full run of `cfg` is charged, and how: {dp, mechanism, guarantee,
  neighbouring, sampling, q, rounds, rounds_charged, noise_multiplier (and its source),
  accounted_noise_multiplier, delta, epsilon and epsilon_accountant (central: the run's;
  local: a client's that takes part in every round), rdp_epsilon, ...}. `model`: the
  run's (default: the config's built-in model)."""
  from fedjax_dp.recipes.privacy import make_privacy, sampling_rate, cohort_sampling
  _check_plannable(cfg)
  mechanism = get_mechanism(cfg.dp)
  tiers = None
  if model is None:
    model, tiers = _model_and_tiers(cfg)
  privacy = make_privacy(cfg, model, tiers)
  z_acc = privacy.accounted_noise_multiplier
  ledger, charged = _charged(cfg, privacy)
  rdp_eps, order = accounting.epsilon_np(ledger, cfg.delta)
  out = {"dp": cfg.dp, **mechanism.describe(cohort_sampling(cfg)),
         "sampling": cfg.sampling, "clients_per_round": cfg.clients_per_round,
         "num_clients": cfg.num_clients, "q": sampling_rate(cfg), "rounds": cfg.rounds,
         "rounds_charged": charged, "target_epsilon": cfg.target_epsilon,
         "noise_multiplier": privacy.noise_multiplier,
         "noise_multiplier_source": ("configured" if cfg.noise_multiplier is not None else
                                     f"calibrated to target_epsilon {cfg.target_epsilon:g}"),
         "accounted_noise_multiplier": z_acc, "delta": cfg.delta,
         "rdp_epsilon": _finite(rdp_eps), "order": order if math.isfinite(rdp_eps) else None,
         "epsilon": _finite(rdp_eps), "epsilon_accountant": "rdp"}
  if privacy.strategy is not None:
    schedule = privacy.participation
    out["correlated_noise"] = {
        "strategy": privacy.strategy.says, "sensitivity": math.sqrt(privacy.strategy.sensitivity2),
        "min_sep": schedule.min_sep, "max_participations": schedule.max_participations,
        "noise_std": privacy.strategy.noise_std(privacy.update_noise_multiplier, cfg.clip_norm),
        **({} if privacy.strategy.sampled is None else
           {"amplified_q": privacy.strategy.sampled})}
  if privacy.adaptive and privacy.count_stddev:
    out["adaptive_clipping"] = {"count_stddev": privacy.count_stddev,
                                "update_noise_multiplier": privacy.update_noise_multiplier}
  if mechanism.per_client_ledgers:
    out["epsilon_is"] = "a client's that takes part in every round"
    out["expected_participations"] = cfg.rounds * cfg.clients_per_round / cfg.num_clients
  if cfg.accountant == "pld" and math.isfinite(rdp_eps) and charged > 0:
    if mechanism.charged_once:   # what the run's ledger holds at its end
      from fedjax_dp.privacy.mechanisms.correlated import charged_steps
      q, z_charged, steps = charged_steps(z_acc, privacy.strategy, charged)
      _add_pld(out, cfg, z_charged, steps, q=q)
    else:
      _add_pld(out, cfg, z_acc, charged)
  return out


def _finite(x: float) -> float | None:
  return float(x) if math.isfinite(x) else None   # JSON has no Infinity: no noise, no figure


def _add_pld(out: dict, cfg: Config, z_acc: float, rounds: int, q: float | None = None) -> None:
  """PLD's figure where the run reports it (the smaller of the two is the epsilon);
  `q`: `rounds` Poisson-subsampled Gaussians of rate q (correlated noise's charge,
  correlated.charged_steps; q = 1 one Gaussian)."""
  from fedjax_dp.errors import AccountError
  from fedjax_dp.privacy.planning import pld_epsilon, pld_epsilon_composed
  local = get_mechanism(cfg.dp).per_client_ledgers
  if not (local or q is not None) and cfg.sampling != "poisson":
    return
  try:   # local DP: the most frequent client's participations, replace one (z / 2)
    pld = (pld_epsilon(q, z_acc, rounds, cfg.delta) if q is not None else
           pld_epsilon(1.0, z_acc / 2, rounds, cfg.delta) if local else
           pld_epsilon_composed(out["q"], [(z_acc, rounds)], cfg.delta))
  except AccountError as e:
    out["pld_note"] = f"no PLD figure: {e}"
    return
  out["pld_epsilon"] = pld
  if pld < out["epsilon"]:
    out["epsilon"], out["epsilon_accountant"] = pld, "pld"


def format_plan(res: dict) -> str:
  """The plan in a few lines: what is charged, the noise, the epsilon."""
  z, z_acc = res["noise_multiplier"], res["accounted_noise_multiplier"]
  q = "" if res["sampling"] == "cyclic" or "correlated_noise" in res else f" (q = {res['q']:.6g})"
  lines = [f"dp {res['dp']}: {res['sampling']} cohorts of {res['clients_per_round']} of "
           f"{res['num_clients']}{q}, {res['rounds']} rounds; neighbours: "
           f"{res['neighbouring']}",
           f"noise multiplier {z:.6g} ({res['noise_multiplier_source']})"
           + ("" if math.isclose(z, z_acc) else f", accounted as {z_acc:.6g}")]
  if "correlated_noise" in res:
    c = res["correlated_noise"]
    how = (f"each a Poisson-subsampled Gaussian (q = {c['amplified_q']:.6g}) of multiplier "
           f"{z:.6g}" if "amplified_q" in c else f"the run is one Gaussian of multiplier {z:.6g}")
    per = " per participation" if "amplified_q" in c else ""
    lines.append(f"{c['strategy']}: sensitivity {c['sensitivity']:.4g}{per} over at most "
                 f"{c['max_participations']} participations {c['min_sep']} rounds apart, noise "
                 f"std {c['noise_std']:.4g}; {how}")
  if "adaptive_clipping" in res:
    a = res["adaptive_clipping"]
    lines.append(f"adaptive clipping: the count's noise std {a['count_stddev']:.4g} and the "
                 f"updates' multiplier {a['update_noise_multiplier']:.6g} compose to {z_acc:.6g}")
  if res["rounds_charged"] < res["rounds"]:
    who = "a client in every round" if "epsilon_is" in res else "the run"
    lines.append(f"target_epsilon {res['target_epsilon']:g} stops {who} after "
                 f"{res['rounds_charged']} of {res['rounds']} rounds")
  whose = " for a client that takes part in every round" if "epsilon_is" in res else ""
  if res["epsilon"] is None:
    lines.append(f"no epsilon{whose}: no noise (noise multiplier {z:g})")
    return "\n".join(lines)
  other = f"; RDP {res['rdp_epsilon']:.6g}" if res["epsilon_accountant"] != "rdp" else ""
  lines.append(f"epsilon = {res['epsilon']:.6g} at delta = {res['delta']:g}{whose} "
               f"({res['epsilon_accountant'].upper()}{other}; as the run charges it)")
  return "\n".join(lines)
