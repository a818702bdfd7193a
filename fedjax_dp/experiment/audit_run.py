"""`fedjax-dp audit`: a run with canary clients, then the one-shot estimate
(privacy/audit.py) beside the epsilon the run's accountant reported.

The run is an ordinary run folder (metrics.jsonl, summary.json, model.msgpack)
with `audit_canaries` set; its audit.json holds the estimate. theta_0 is the
run's seeded initialisation (public in every mode), taken as the run starts.
With `all_iterates`, the rounds run one at a time and a second estimate reads
every round's model (privacy/audit.iterate_tracker).
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np

from fedjax_dp.experiment.errors import RunError


def _undercharged(sim, factor: float | None):
  """The test mode: `sim` applying `factor` times the noise its accountant charges
  (the ledger reads the config's multiplier)."""
  if factor is None:
    return sim
  hp = dict(sim.hparams)
  hp["tier_scales"] = hp["tier_scales"] * factor
  return dataclasses.replace(sim, hparams=hp)


def _undercharge(factor: float):
  """The test mode as a run's callback."""
  from fedjax_dp.callbacks import Callback

  def start(ctx) -> None:
    ctx.sim = _undercharged(ctx.sim, factor)
  return Callback(on_run_start=start)


def _audit_values(config, undercharge: float | None) -> dict:
  """The config's values, or a RunError for what no audit can check."""
  from fedjax_dp.config import Config, make_config
  values = config.to_dict() if isinstance(config, Config) else dict(config)
  cfg = make_config(values)
  if cfg.dp == "none":
    raise RunError("fedjax-dp audit: dp 'none' has no differential-privacy mechanism whose "
                   "guarantee canaries can check (set dp central or local)")
  if cfg.algorithm == "solo":
    raise RunError("fedjax-dp audit: algorithm 'solo' releases no global model")
  if undercharge is not None and not 0 < undercharge < 1:
    raise RunError(f"fedjax-dp audit: --undercharge {undercharge}: a fraction in (0, 1) of "
                   "the charged noise")
  return values


def _test_mode(undercharge: float | None) -> dict:
  return ({"undercharged_test_mode": f"the rounds applied {undercharge} times the noise the "
                                     "accountant charged"} if undercharge else {})


def _observer(cfg, canaries: int, held_out: int, all_iterates: bool):
  """The callback that keeps theta_0 (and, with all_iterates, runs the rounds one
  at a time and tracks each direction's largest cosine with a round's change)."""
  from fedjax_dp.callbacks import Callback
  from fedjax_dp.config.schema import data_seed
  from fedjax_dp.privacy import audit as audit_lib
  seen: dict = {}

  def start(ctx) -> None:
    seen["theta0"] = jax.device_get(ctx.state.params)
    if all_iterates:
      ctx.round_by_round = True
      seen["update"], seen["result"] = audit_lib.iterate_tracker(
          cfg.num_clients, canaries, held_out, data_seed(cfg), ctx.state.params)

  def after(ctx, stats) -> None:
    if all_iterates:
      seen["update"](ctx.state.params)
  return Callback(on_run_start=start, after_chunk=after), seen


def audit(config, *, out: str, canaries: int, held_out: int | None = None,
          bootstrap: int = 1000, log=print, progress: bool = True,
          undercharge: float | None = None, all_iterates: bool = False) -> dict:
  """Runs `config` (a dict or Config) with `canaries` canary clients into `out`
  and returns the audit report (also written to out/audit.json).

  `undercharge` in (0, 1), a test mode that shows the audit can fail: the rounds
  apply that fraction of the noise the accountant charges, so the reported
  epsilon is wrong on purpose (the report and audit.json say so; never a run to
  publish).

  `all_iterates`: also the estimate of an observer of every round's model (the
  report's "all_iterates"): each direction's statistic is its largest cosine with
  one round's model change (Andrew et al. 2023). The rounds then run one at a time
  and the directions stay on the device ((canaries + held_out) x params floats)."""
  import fedjax_dp
  from fedjax_dp.config import make_config
  from fedjax_dp.experiment.final_model import load_params
  from fedjax_dp.privacy import audit as audit_lib
  from fedjax_dp.config.schema import data_seed
  values = _audit_values(config, undercharge)
  held_out = canaries if held_out is None else held_out
  if min(canaries, held_out) < audit_lib.MIN_CANARIES:
    raise RunError(f"fedjax-dp audit: --canaries {canaries} and --held-out {held_out}: at "
                   f"least {audit_lib.MIN_CANARIES} of each")
  cfg = make_config({**values, "audit_canaries": canaries})
  observer, seen = _observer(cfg, canaries, held_out, all_iterates)
  callbacks = [observer] + ([] if undercharge is None else [_undercharge(undercharge)])
  fedjax_dp.run(cfg, out=out, log=log, progress=progress, callbacks=callbacks)
  change = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), load_params(out),
                        seen["theta0"])
  inserted, outside = audit_lib.cosines(change, cfg.num_clients, canaries, held_out,
                                        data_seed(cfg))
  with open(os.path.join(out, "summary.json")) as f:
    privacy = json.load(f)["privacy"]
  report = {"method": "one-shot canary audit (Andrew et al. 2023): cosines of the final "
                      "model's change with inserted and held-out canary directions",
            "canaries": canaries, "held_out": held_out,
            **audit_lib.estimate(inserted, outside, cfg.delta, bootstrap),
            **({"all_iterates": _all_iterates(seen["result"], cfg.delta, bootstrap)}
               if all_iterates else {}),
            "accounted_epsilon": privacy.get("epsilon"),
            "accountant": privacy.get("epsilon_accountant"),
            **_test_mode(undercharge)}
  acc = report["accounted_epsilon"]
  report["exceeds_accounted"] = bool(acc is not None and report["ci95"][0] > acc)
  if all_iterates:
    report["all_iterates"]["exceeds_accounted"] = bool(
        acc is not None and report["all_iterates"]["ci95"][0] > acc)
  with open(os.path.join(out, "audit.json"), "w") as f:
    json.dump(report, f, indent=2)
  return report


def audit_runs(config, *, out: str, runs: int, bootstrap: int = 1000,
               confidence: float = 0.95, log=print, progress: bool = True,
               undercharge: float | None = None) -> dict:
  """The multi-run audit, for models small enough to train `runs` times: run r
  (seed config seed + r, the data seed fixed) has one canary client that uploads
  clip_norm times a fixed direction c in a seeded half of the runs and zeros in
  the other half (the neighbouring dataset without it). Each run's statistic is
  <theta_T - theta_0, c>. Reports the Gaussian fit of the two sets (as the
  one-shot audit's) and a lower bound on epsilon that holds with probability
  `confidence` (privacy/audit.threshold_bound), beside the accounted epsilon.

  The first run is an ordinary run folder, out/run (its summary.json holds the
  accountant's report); the others reuse its compiled round. Writes out/audit.json
  and out/runs.csv (run, seed, inserted, statistic)."""
  import csv
  import jax.numpy as jnp
  import fedjax_dp
  from fedjax_dp.config import make_config
  from fedjax_dp.config.schema import data_seed
  from fedjax_dp.experiment.final_model import load_params
  from fedjax_dp.privacy import audit as audit_lib
  from jax.flatten_util import ravel_pytree
  values = _audit_values(config, undercharge)
  if runs < 2 * audit_lib.MIN_CANARIES:
    raise RunError(f"fedjax-dp audit: --runs {runs}: at least {2 * audit_lib.MIN_CANARIES} "
                   f"(half with the canary, half without)")
  if not 0 < confidence < 1:
    raise RunError(f"fedjax-dp audit: confidence {confidence}: a probability in (0, 1)")
  if os.path.isdir(out) and os.listdir(out):
    raise RunError(f"fedjax-dp audit: --out {out} is not empty; a multi-run audit writes a "
                   "new folder (nothing there is overwritten)")
  base = make_config({**values, "audit_canaries": 1})
  inserted = np.zeros(runs, bool)
  inserted[np.random.default_rng([data_seed(base), audit_lib.CANARY_DRAW]).permutation(
      runs)[:runs // 2]] = True
  cfg = make_config({"audit_canary_scale": float(inserted[0])}, base=base)
  observer, seen = _observer(cfg, 1, 0, False)

  def keep_sim(ctx) -> None:
    seen["sim"], seen["rounds"] = ctx.sim, ctx.round
  callbacks = [observer] + ([] if undercharge is None else [_undercharge(undercharge)]) + [
      fedjax_dp.callbacks.Callback(on_run_end=keep_sim)]
  first = os.path.join(out, "run")
  fedjax_dp.run(cfg, out=first, log=log, progress=progress, callbacks=callbacks)
  flat0 = ravel_pytree(seen["theta0"])[0]
  canary = np.flatnonzero(audit_lib.canary_clients(cfg.num_clients, 1, data_seed(cfg)))
  c = np.asarray(audit_lib.directions(audit_lib.canary_key(data_seed(cfg)),
                                      jnp.asarray(canary, jnp.int32), flat0.shape[0])[0],
                 np.float64)

  def statistic(theta0, theta):
    change = (np.asarray(ravel_pytree(theta)[0], np.float64)
              - np.asarray(ravel_pytree(theta0)[0], np.float64))
    return float(change @ c)
  stats = np.zeros(runs)
  stats[0] = statistic(seen["theta0"], load_params(first))
  sim0 = seen["sim"]
  for r in range(1, runs):
    sim = sim0.with_seed(cfg.seed + r).with_hparams(audit_canary_scale=float(inserted[r]))
    sim = _undercharged(sim, undercharge)
    state = sim.init_state()
    theta0 = jax.device_get(state.params)
    state, _ = sim.run_rounds(state, seen["rounds"])
    stats[r] = statistic(theta0, jax.device_get(state.params))
    if progress and (r + 1) % max(1, runs // 10) == 0:
      log(f"audit: {r + 1} of {runs} runs")
  with open(os.path.join(first, "summary.json")) as f:
    privacy = json.load(f)["privacy"]
  report = {"method": "multi-run audit: one canary client, inserted in half of the runs "
                      "(zeros in the others); per run, the final model change's component "
                      "along the canary's direction",
            "runs": runs, "inserted_runs": int(inserted.sum()), "rounds": seen["rounds"],
            "canary_client": int(canary[0]), "seeds": [cfg.seed, cfg.seed + runs - 1],
            "gaussian_fit": audit_lib.estimate(stats[inserted], stats[~inserted], cfg.delta,
                                               bootstrap),
            **audit_lib.threshold_bound(stats[inserted], stats[~inserted], cfg.delta,
                                        confidence, seed=data_seed(cfg)),
            "accounted_epsilon": privacy.get("epsilon"),
            "accountant": privacy.get("epsilon_accountant"),
            **_test_mode(undercharge)}
  acc = report["accounted_epsilon"]
  report["exceeds_accounted"] = bool(acc is not None and report["epsilon_lower_bound"] > acc)
  report["gaussian_fit"]["exceeds_accounted"] = bool(
      acc is not None and report["gaussian_fit"]["ci95"][0] > acc)
  with open(os.path.join(out, "runs.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["run", "seed", "inserted", "statistic"])
    for r in range(runs):
      w.writerow([r, cfg.seed + r, int(inserted[r]), repr(float(stats[r]))])
  with open(os.path.join(out, "audit.json"), "w") as f:
    json.dump(report, f, indent=2)
  return report


def _all_iterates(result, delta: float, bootstrap: int) -> dict:
  from fedjax_dp.privacy import audit as audit_lib
  inserted, outside = result()
  if not (np.all(np.isfinite(inserted)) and np.all(np.isfinite(outside))):
    raise RunError("fedjax-dp audit: no round changed the model, so no iterate shows the "
                   "canaries (all_iterates)")
  return {"statistic": "each direction's largest cosine with one round's model change",
          **audit_lib.estimate(inserted, outside, delta, bootstrap)}


def format_report(report: dict) -> str:
  lo, hi = report["ci95"]
  acc = report["accounted_epsilon"]

  def verdict(r):
    return ("ABOVE the accounted epsilon: the accountant charged less than was released"
            if r["exceeds_accounted"] else "not above the accounted epsilon")
  lines = [
      *([f"TEST MODE: {report['undercharged_test_mode']}"]
        if "undercharged_test_mode" in report else []),
      f"privacy audit: {report['canaries']} canaries inserted, {report['held_out']} held out",
      f"  cosines: inserted {report['mu_inserted']:.4g} +- {report['sd_inserted']:.3g}, "
      f"held out {report['mu_held_out']:.4g} +- {report['sd_held_out']:.3g}",
      f"  empirical epsilon {report['empirical_epsilon']:.3f} (95 % interval {lo:.3f} to "
      f"{hi:.3f}, delta {report['delta']:g})",
      f"  accounted epsilon {acc:.3f} ({report['accountant']})" if acc is not None else
      "  accounted epsilon: none reported",
      f"  {verdict(report)}"]
  if "all_iterates" in report:
    it = report["all_iterates"]
    lines += [f"  every round's model seen (largest cosine with a round's change): empirical "
              f"epsilon {it['empirical_epsilon']:.3f} (95 % interval {it['ci95'][0]:.3f} to "
              f"{it['ci95'][1]:.3f}), {verdict(it)}"]
  return "\n".join(lines)


def format_runs_report(report: dict) -> str:
  """The multi-run audit's lines."""
  fit, acc = report["gaussian_fit"], report["accounted_epsilon"]
  return "\n".join([
      *([f"TEST MODE: {report['undercharged_test_mode']}"]
        if "undercharged_test_mode" in report else []),
      f"privacy audit: {report['runs']} runs, the canary in {report['inserted_runs']}",
      f"  statistic: with the canary {fit['mu_inserted']:.4g} +- {fit['sd_inserted']:.3g}, "
      f"without {fit['mu_held_out']:.4g} +- {fit['sd_held_out']:.3g}",
      f"  epsilon lower bound {report['epsilon_lower_bound']:.3f} with confidence "
      f"{report['confidence']:g} (threshold test on {sum(report['runs_tested'])} held-out "
      f"runs: {report['false_positives']} false positives, {report['false_negatives']} "
      f"false negatives)",
      f"  Gaussian fit: empirical epsilon {fit['empirical_epsilon']:.3f} (95 % interval "
      f"{fit['ci95'][0]:.3f} to {fit['ci95'][1]:.3f}, delta {fit['delta']:g})",
      f"  accounted epsilon {acc:.3f} ({report['accountant']})" if acc is not None else
      "  accounted epsilon: none reported",
      "  " + ("ABOVE the accounted epsilon: the accountant charged less than was released"
              if report["exceeds_accounted"] else "the lower bound is not above the accounted "
              "epsilon")])
