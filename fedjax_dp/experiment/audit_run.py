"""`fedjax-dp audit`: a run with canary clients, then the one-shot estimate
(adversary/audit.py) beside the epsilon the run's accountant reported.

The run is an ordinary run folder (metrics.jsonl, summary.json, model.msgpack)
with `audit_canaries` set; its audit.json holds the estimate. theta_0 is the
run's seeded initialisation (public in every mode), taken as the run starts.
With `all_iterates`, the rounds run one at a time and a second estimate reads
every round's model (adversary/audit.iterate_tracker).
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np

from fedjax_dp.errors import RunError
from fedjax_dp.privacy.mechanisms import get_mechanism


def _undercharged(sim, factor: float | None):
  """The test mode: `sim` applying `factor` times the noise its accountant charges
  (the ledger reads the config's multiplier)."""
  if factor is None:
    return sim
  hp = dict(sim.hparams)
  hp["tier_scales"] = hp["tier_scales"] * factor
  return dataclasses.replace(sim, hparams=hp)


def _undercharge(factor: float, seen: dict):
  """The test mode as a run's callback. The run's own reports (summary.json,
  metrics.jsonl, epsilon.png) then give no epsilon (RunContext.test_mode), so the
  audit compares with seen["charged"]: the privacy report without that mark."""
  from fedjax_dp.experiment.loop import Callback
  from fedjax_dp.experiment.reports.privacy_report import privacy_report

  def start(ctx) -> None:
    ctx.sim = _undercharged(ctx.sim, factor)
    ctx.test_mode = (f"TEST MODE: the rounds applied {factor} times the noise the accountant "
                     "charged; no guarantee")

  def end(ctx) -> None:
    seen["charged"] = privacy_report(ctx.cfg, ctx.sim, ctx.state, ctx.plog, assume=False)
  return Callback(on_run_start=start, on_run_end=end)


def _accounted(out: str, seen: dict) -> dict:
  """The privacy report the audit compares with: the run's summary.json's, or in
  the test mode the one it computed before marking it (summary.json's has none)."""
  if "charged" in seen:
    return seen["charged"]
  with open(os.path.join(out, "summary.json")) as f:
    return json.load(f)["privacy"]


def _audit_values(config, undercharge: float | None) -> dict:
  """The config's values, or a RunError for what no audit can check."""
  from fedjax_dp.config import Config
  from fedjax_dp.recipes.config_checks import make_config
  values = config.to_dict() if isinstance(config, Config) else dict(config)
  for key in ("audit_canaries", "audit_canary_scale"):
    if key in values and values[key] != getattr(Config(), key):
      raise RunError(f"fedjax-dp audit: config key {key!r} = {values[key]!r}: the audit sets "
                     "the canaries (--canaries, or --runs for the multi-run audit)")
    values.pop(key, None)
  cfg = make_config(values)
  if not get_mechanism(cfg.dp).private:
    raise RunError("fedjax-dp audit: dp 'none' has no differential-privacy mechanism whose "
                   "guarantee canaries can check (set dp central or local)")
  if cfg.algorithm == "solo":
    raise RunError("fedjax-dp audit: algorithm 'solo' releases no global model")
  if undercharge is not None and not 0 < undercharge < 1:
    raise RunError(f"fedjax-dp audit: --undercharge {undercharge}: a fraction in (0, 1) of "
                   "the charged noise")
  return values


def _say_test_mode(undercharge: float | None, log) -> None:
  """The test mode said before anything else (the noise line that follows gives the
  multiplier the accountant charges, not the one the rounds apply)."""
  if undercharge is not None:
    log(f"TEST MODE: the rounds apply {undercharge} times the noise the accountant charges "
        "(the noise multiplier below is the charged one); no guarantee")


def _test_mode(undercharge: float | None) -> dict:
  return ({"undercharged_test_mode": f"the rounds applied {undercharge} times the noise the "
                                     "accountant charged"} if undercharge else {})


def _observer(cfg, canaries: int, held_out: int, all_iterates: bool):
  """The callback that keeps theta_0 (and, with all_iterates, runs the rounds one
  at a time and tracks each direction's largest cosine with a round's change)."""
  from fedjax_dp.experiment.loop import Callback
  from fedjax_dp.config.schema import data_seed
  from fedjax_dp.adversary import audit as audit_lib
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
          undercharge: float | None = None, all_iterates: bool = False,
          confidence: float = 0.95) -> dict:
  """Runs `config` (a dict or Config) with `canaries` canary clients into `out`
  and returns the audit report (also written to out/audit.json).

  `undercharge` in (0, 1), a test mode that shows the audit can fail: the rounds
  apply that fraction of the noise the accountant charges, so the charged epsilon
  is wrong on purpose. The report and audit.json say so and compare with it; the
  run's own summary.json, metrics.jsonl rows and plots give no epsilon (TEST MODE
  in epsilon_why_none and the privacy report's test_mode; never a run to publish).

  `all_iterates`: also the estimate of an observer of every round's model (the
  report's "all_iterates"): each direction's statistic is its largest cosine with
  one round's model change (Andrew et al. 2023). The rounds then run one at a time
  and the directions stay on the device ((canaries + held_out) x params floats).

  Beside the estimate, `one_run`: lower bounds on epsilon from the same cosines
  that hold with probability `confidence` (adversary/audit.one_run_bounds:
  Steinke et al. 2023 and its f-DP refinement, through jax-privacy), the attack's
  TPR at low FPR and its ROC's area."""
  from fedjax_dp.experiment.runner import run_experiment
  from fedjax_dp.recipes.config_checks import make_config
  from fedjax_dp.experiment.final_model import load_params
  from fedjax_dp.adversary import audit as audit_lib
  from fedjax_dp.config.schema import data_seed
  values = _audit_values(config, undercharge)
  if not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
    raise RunError(f"fedjax-dp audit: --confidence {confidence!r}: a probability in (0, 1)")
  held_out = canaries if held_out is None else held_out
  if min(canaries, held_out) < audit_lib.MIN_CANARIES:
    raise RunError(f"fedjax-dp audit: --canaries {canaries} and --held-out {held_out}: at "
                   f"least {audit_lib.MIN_CANARIES} of each")
  cfg = make_config({**values, "audit_canaries": canaries})
  observer, seen = _observer(cfg, canaries, held_out, all_iterates)
  callbacks = [observer] + ([] if undercharge is None else [_undercharge(undercharge, seen)])
  _say_test_mode(undercharge, log)
  run_experiment(cfg, out, log=log, progress=progress, callbacks=callbacks)
  change = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), load_params(out),
                        seen["theta0"])
  inserted, outside = audit_lib.cosines(change, cfg.num_clients, canaries, held_out,
                                        data_seed(cfg))
  privacy = _accounted(out, seen)
  report = {"method": "one-shot canary audit (Andrew et al. 2023): cosines of the final "
                      "model's change with inserted and held-out canary directions",
            "canaries": canaries, "held_out": held_out,
            **audit_lib.estimate(inserted, outside, cfg.delta, bootstrap),
            "one_run": audit_lib.one_run_bounds(inserted, outside, cfg.delta, confidence,
                                                gaussian_release(cfg)),
            **({"all_iterates": _all_iterates(seen["result"], cfg.delta, bootstrap,
                                              confidence, gaussian_release(cfg))}
               if all_iterates else {}),
            "accounted_epsilon": privacy.get("epsilon"),
            "accountant": privacy.get("epsilon_accountant"),
            **_test_mode(undercharge)}
  acc = report["accounted_epsilon"]
  for r in (report, report.get("all_iterates")):
    if r is not None:
      r["exceeds_accounted"] = bool(acc is not None and r["ci95"][0] > acc)
      bound = r["one_run"]["epsilon_one_run"]
      r["one_run"]["exceeds_accounted"] = bool(acc is not None and bound is not None
                                               and bound > acc)
  with open(os.path.join(out, "audit.json"), "w") as f:
    json.dump(report, f, indent=2)
  return report


def neighbour_scale(cfg) -> float:
  """The canary's audit_canary_scale in the multi-run audit's runs without it: 0
  (the canary absent) where the accountant charges adding or removing a client
  (central DP, Poisson sampling), -1 (its upload negated, 2 clip_norm away) where
  it charges replacing one (fixed-size cohorts, local DP); 0 (zero-out) under
  correlated noise, whose accountant charges replacing a client's updates by zero."""
  mechanism = get_mechanism(cfg.dp)
  if mechanism.charged_once:
    return 0.0
  return -1.0 if mechanism.per_client_ledgers or cfg.sampling == "fixed" else 0.0


def _check_runs(cfg, runs: int, confidence: float, out: str) -> None:
  """RunErrors for a multi-run audit that could not hold, before anything runs."""
  from fedjax_dp.adversary import audit as audit_lib
  if runs < 2 * audit_lib.MIN_CANARIES:
    raise RunError(f"fedjax-dp audit: --runs {runs}: at least {2 * audit_lib.MIN_CANARIES} "
                   "(half with the canary, half without)")
  if not 0 < confidence < 1:
    raise RunError(f"fedjax-dp audit: --confidence {confidence}: a probability in (0, 1)")
  if cfg.noise_schedule != "static":
    raise RunError(f"fedjax-dp audit: --runs with noise_schedule {cfg.noise_schedule!r}: the "
                   "noise follows each run's releases, so each run is charged its own epsilon "
                   "and no one figure covers them all (use noise_schedule static)")
  if get_mechanism(cfg.dp).per_client_ledgers and cfg.clients_per_round < cfg.num_clients:
    raise RunError(f"fedjax-dp audit: --runs under dp 'local' with clients_per_round "
                   f"{cfg.clients_per_round} of {cfg.num_clients}: the canary's own epsilon "
                   "would differ from run to run (set clients_per_round to num_clients)")
  if os.path.isdir(out) and os.listdir(out):
    raise RunError(f"fedjax-dp audit: --out {out} is not empty; a multi-run audit writes a "
                   "new folder (nothing there is overwritten)")


def audit_runs(config, *, out: str, runs: int, bootstrap: int = 1000,
               confidence: float = 0.95, log=print, progress: bool = True,
               undercharge: float | None = None) -> dict:
  """The multi-run audit, for models small enough to train `runs` times: run r
  (seed config seed + r, the data seed fixed) has one canary client that
  uploads clip_norm times a fixed direction c in a seeded half of the runs and
  is its neighbour in the other half (absent, or its upload negated:
  neighbour_scale). Each run's statistic is <theta_T - theta_0, c>. Reports the
  Gaussian fit of the two sets (as the one-shot audit's) and a lower bound on
  epsilon that holds with probability `confidence`
  (adversary/audit.threshold_bound), beside the accounted epsilon, which must be
  the same in every run (checked).

  The first run is an ordinary run folder, out/run (its summary.json holds the
  accountant's report; in the test mode without an epsilon, as `audit`'s); the
  others run the same compiled chunks. Writes
  out/runs.csv (run, seed, inserted, statistic, the ledger's epsilon) as the runs
  finish, then out/audit.json."""
  from fedjax_dp.recipes.config_checks import make_config
  from fedjax_dp.config.schema import data_seed
  from fedjax_dp.adversary import audit as audit_lib
  values = _audit_values(config, undercharge)
  base = make_config({**values, "audit_canaries": 1})
  _check_runs(base, runs, confidence, out)
  inserted = np.zeros(runs, bool)
  inserted[np.random.default_rng([data_seed(base), audit_lib.CANARY_DRAW]).permutation(
      runs)[:runs // 2]] = True
  other = neighbour_scale(base)
  scales = np.where(inserted, 1.0, other)
  cfg = make_config({"audit_canary_scale": float(scales[0])}, base=base)
  _say_test_mode(undercharge, log)
  stats, ledger, privacy, rounds = _run_all(cfg, out, scales, undercharge, log, progress)
  if not np.all(np.isfinite(stats)):
    bad = np.flatnonzero(~np.isfinite(stats))
    raise RunError(f"fedjax-dp audit: run {int(bad[0])} (seed {cfg.seed + int(bad[0])}) ended "
                   f"with a model that is not finite ({bad.size} of {runs} runs): no statistic "
                   "to test (lower the learning rate)")
  if not np.allclose(ledger, ledger[0], rtol=1e-9, atol=0):
    raise RunError("fedjax-dp audit: the runs were charged different epsilons "
                   f"({ledger.min():.6g} to {ledger.max():.6g}; runs.csv): no one accounted "
                   "figure to compare with")
  report = {"method": "multi-run audit: one canary client, in half of the runs, its "
                      "neighbour in the others; per run, the final model change's component "
                      "along the canary's direction",
            "neighbours": ("add/remove: the canary absent" if other == 0 else
                           "replace-one: the canary's upload negated"),
            "runs": runs, "inserted_runs": int(inserted.sum()), "rounds": rounds,
            "canary_client": int(np.flatnonzero(audit_lib.canary_clients(
                cfg.num_clients, 1, data_seed(cfg)))[0]),
            "seeds": [cfg.seed, cfg.seed + runs - 1],
            "gaussian_fit": audit_lib.estimate(stats[inserted], stats[~inserted], cfg.delta,
                                               bootstrap),
            **audit_lib.threshold_bound(stats[inserted], stats[~inserted], cfg.delta,
                                        confidence, seed=data_seed(cfg)),
            "accounted_epsilon": privacy.get("epsilon"),
            "accountant": privacy.get("epsilon_accountant"),
            **_test_mode(undercharge)}
  acc = report["accounted_epsilon"]
  report["exceeds_accounted"] = bool(acc is not None and report["epsilon_lower_bound"] > acc)
  report["can_exceed_accounted"] = bool(acc is None or report["largest_possible_bound"] > acc)
  report["gaussian_fit"]["exceeds_accounted"] = bool(
      acc is not None and report["gaussian_fit"]["ci95"][0] > acc)
  with open(os.path.join(out, "audit.json"), "w") as f:
    json.dump(report, f, indent=2)
  return report


def _run_all(cfg, out: str, scales: np.ndarray, undercharge, log, progress):
  """Every run's statistic and ledger epsilon (float64 [runs] each), the first
  run's privacy report and the rounds run. Run 0 as fedjax_dp.run runs it (into
  out/run), the others on its simulation, in its chunks."""
  import csv
  from jax.flatten_util import ravel_pytree
  from fedjax_dp.experiment.loop import Callback
  from fedjax_dp.experiment.runner import run_experiment
  from fedjax_dp.config.schema import data_seed
  from fedjax_dp.experiment.final_model import load_params
  from fedjax_dp.experiment.loop import chunk_ends
  from fedjax_dp.adversary import audit as audit_lib
  observer, seen = _observer(cfg, 1, 0, False)

  def keep(ctx) -> None:
    seen["sim"], seen["rounds"], seen["state"] = ctx.sim, ctx.round, ctx.state
  callbacks = [observer] + ([] if undercharge is None else [_undercharge(undercharge, seen)]) + [
      Callback(on_run_end=keep)]
  first = os.path.join(out, "run")
  run_experiment(cfg, first, log=log, progress=progress, callbacks=callbacks)
  d = ravel_pytree(seen["theta0"])[0].shape[0]
  c = np.asarray(audit_lib.direction_matrix(cfg.num_clients, 1, 0, data_seed(cfg), d)[0],
                 np.float64)

  def statistic(theta0, theta) -> float:
    flat = lambda p: np.asarray(ravel_pytree(p)[0], np.float64)
    return float((flat(theta) - flat(theta0)) @ c)

  def spent(sim, state) -> float:
    return float(np.max(sim.epsilons(state)[0]))
  runs = len(scales)
  stats, ledger = np.zeros(runs), np.zeros(runs)
  stats[0] = statistic(seen["theta0"], load_params(first))
  ledger[0] = spent(seen["sim"], seen["state"])
  ends = chunk_ends(0, cfg, seen["rounds"])
  with open(os.path.join(out, "runs.csv"), "w", newline="") as f:
    rows = csv.writer(f)
    # the test mode's runs applied less noise than their ledger charged: the column says so
    rows.writerow(["run", "seed", "inserted", "statistic",
                   "ledger_epsilon" if undercharge is None else "charged_epsilon_test_mode"])

    def row(r):
      rows.writerow([r, cfg.seed + r, int(scales[r] == 1), repr(float(stats[r])),
                     repr(float(ledger[r]))])   # numpy 2 reprs np.float64(...)
      f.flush()
    row(0)
    for r in range(1, runs):
      sim = _undercharged(seen["sim"].with_seed(cfg.seed + r).with_hparams(
          audit_canary_scale=float(scales[r])), undercharge)
      state = sim.init_state()
      theta0, done = jax.device_get(state.params), 0
      for end in ends:
        state, _ = sim.run_rounds(state, end - done)
        done = end
      stats[r], ledger[r] = statistic(theta0, jax.device_get(state.params)), spent(sim, state)
      row(r)
      if progress and (r + 1) % max(1, runs // 10) == 0:
        log(f"audit: {r + 1} of {runs} runs")
  return stats, ledger, _accounted(first, seen), seen["rounds"]


def gaussian_release(cfg) -> bool:
  """Whether the release is one Gaussian mechanism, so that the f-DP refinement is a
  bound: no subsampling (every client in every round, or a fixed schedule) and a
  fixed clip (adaptive clipping's moves with the data)."""
  full = cfg.clients_per_round == cfg.num_clients or cfg.sampling == "cyclic"
  return full and not cfg.adaptive_clipping


def _all_iterates(result, delta: float, bootstrap: int, confidence: float,
                  gaussian: bool) -> dict:
  from fedjax_dp.adversary import audit as audit_lib
  inserted, outside = result()
  if not (np.all(np.isfinite(inserted)) and np.all(np.isfinite(outside))):
    raise RunError("fedjax-dp audit: no round changed the model, so no iterate shows the "
                   "canaries (all_iterates)")
  return {"statistic": "each direction's largest cosine with one round's model change",
          **audit_lib.estimate(inserted, outside, delta, bootstrap),
          "one_run": audit_lib.one_run_bounds(inserted, outside, delta, confidence, gaussian)}
