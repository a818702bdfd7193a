"""`fedjax-dp audit`: a run with canary clients, then the one-shot estimate
(privacy/audit.py) beside the epsilon the run's accountant reported.

The run is an ordinary run folder (metrics.jsonl, summary.json, model.msgpack)
with `audit_canaries` set; its audit.json holds the estimate. theta_0 is the
seeded initialisation, rebuilt from the config (public in every mode).
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np

from fedjax_dp.experiment.errors import RunError


def _undercharge(factor: float):
  """The test mode's callback: the round applies `factor` times the noise its
  accountant charges (the ledger reads the config's multiplier)."""
  from fedjax_dp.callbacks import Callback

  def start(ctx) -> None:
    hp = dict(ctx.sim.hparams)
    hp["tier_scales"] = hp["tier_scales"] * factor
    ctx.sim = dataclasses.replace(ctx.sim, hparams=hp)
  return Callback(on_run_start=start)


def audit(config, *, out: str, canaries: int, held_out: int | None = None,
          bootstrap: int = 1000, log=print, progress: bool = True,
          undercharge: float | None = None) -> dict:
  """Runs `config` (a dict or Config) with `canaries` canary clients into `out`
  and returns the audit report (also written to out/audit.json).

  `undercharge` in (0, 1), a test mode that shows the audit can fail: the rounds
  apply that fraction of the noise the accountant charges, so the reported
  epsilon is wrong on purpose (the report and audit.json say so; never a run to
  publish)."""
  import fedjax_dp
  from fedjax_dp.config import Config, make_config
  from fedjax_dp.experiment.final_model import load_params
  from fedjax_dp.experiment.setup import setup
  from fedjax_dp.privacy import audit as audit_lib
  from fedjax_dp.config.schema import data_seed
  values = config.to_dict() if isinstance(config, Config) else dict(config)
  if make_config(values).dp == "none":
    raise RunError("fedjax-dp audit: dp 'none' has no differential-privacy mechanism whose "
                   "guarantee canaries can check (set dp central or local)")
  if undercharge is not None and not 0 < undercharge < 1:
    raise RunError(f"fedjax-dp audit: --undercharge {undercharge}: a fraction in (0, 1) of "
                   "the charged noise")
  held_out = canaries if held_out is None else held_out
  if min(canaries, held_out) < audit_lib.MIN_CANARIES:
    raise RunError(f"fedjax-dp audit: --canaries {canaries} and --held-out {held_out}: at "
                   f"least {audit_lib.MIN_CANARIES} of each")
  cfg = make_config({**values, "audit_canaries": canaries})
  if cfg.algorithm == "solo":
    raise RunError("fedjax-dp audit: algorithm 'solo' releases no global model")
  callbacks = [] if undercharge is None else [_undercharge(undercharge)]
  fedjax_dp.run(cfg, out=out, log=log, progress=progress, callbacks=callbacks)
  theta0 = setup(cfg)[2].init_state().params
  change = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), load_params(out),
                        jax.device_get(theta0))
  inserted, outside = audit_lib.cosines(change, cfg.num_clients, canaries, held_out,
                                        data_seed(cfg))
  with open(os.path.join(out, "summary.json")) as f:
    privacy = json.load(f)["privacy"]
  report = {"method": "one-shot canary audit (Andrew et al. 2023): cosines of the final "
                      "model's change with inserted and held-out canary directions",
            "canaries": canaries, "held_out": held_out,
            **audit_lib.estimate(inserted, outside, cfg.delta, bootstrap),
            "accounted_epsilon": privacy.get("epsilon"),
            "accountant": privacy.get("epsilon_accountant"),
            **({"undercharged_test_mode": f"the rounds applied {undercharge} times the noise "
                                          "the accountant charged"} if undercharge else {})}
  acc = report["accounted_epsilon"]
  report["exceeds_accounted"] = bool(acc is not None and report["ci95"][0] > acc)
  with open(os.path.join(out, "audit.json"), "w") as f:
    json.dump(report, f, indent=2)
  return report


def format_report(report: dict) -> str:
  lo, hi = report["ci95"]
  acc = report["accounted_epsilon"]
  verdict = ("ABOVE the accounted epsilon: the accountant charged less than was released"
             if report["exceeds_accounted"] else "not above the accounted epsilon")
  return "\n".join([
      *([f"TEST MODE: {report['undercharged_test_mode']}"]
        if "undercharged_test_mode" in report else []),
      f"privacy audit: {report['canaries']} canaries inserted, {report['held_out']} held out",
      f"  cosines: inserted {report['mu_inserted']:.4g} +- {report['sd_inserted']:.3g}, "
      f"held out {report['mu_held_out']:.4g} +- {report['sd_held_out']:.3g}",
      f"  empirical epsilon {report['empirical_epsilon']:.3f} (95 % interval {lo:.3f} to "
      f"{hi:.3f}, delta {report['delta']:g})",
      f"  accounted epsilon {acc:.3f} ({report['accountant']})" if acc is not None else
      "  accounted epsilon: none reported",
      f"  {verdict}"])
