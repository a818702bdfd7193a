"""Privacy attacks on a finished run's model: `fedjax-dp attack mia --run DIR`.

The run folder gives the config (config.json), the trained parameters
(model.msgpack) and the guarantee it reported (summary.json's privacy block);
the data are rebuilt from the config as the run built them (the same partition,
scaling and, for a data attack, poisoning). Runs on your own data or model take
them again: `attack_mia(run_dir, data=..., model=...)`.
"""

from __future__ import annotations

import json
import os

from fedjax_dp.experiment.errors import RunError


def attack_mia(run_dir: str, *, examples: int | None = None, seed: int = 0, data=None,
               model=None) -> dict:
  """The loss-threshold membership-inference attack (privacy/membership.py) on the
  model a run saved; the report also names the run and its reported guarantee."""
  from fedjax_dp.experiment.final_model import load_params
  from fedjax_dp.experiment.run_folder import saved_config
  from fedjax_dp.experiment.setup import setup
  from fedjax_dp.privacy import membership
  cfg = saved_config(os.path.join(run_dir, "config.json"))
  if cfg.algorithm == "solo":
    raise RunError(f"{run_dir}: algorithm 'solo' trains no global model to attack")
  if cfg.dataset == "custom" and data is None:
    raise RunError(f"{run_dir} trained on data of your own: pass it again, "
                   "attack_mia(run_dir, data=...)")
  params = load_params(run_dir)
  ds, _, sim = setup(cfg, data, model=model)
  if ds.num_classes < 2:
    raise RunError(f"{run_dir}: the loss-threshold attack reads a classifier's "
                   "cross-entropy, and this run's targets are real values")
  privacy = _reported_privacy(run_dir)
  report = membership.loss_threshold_attack(
      sim.model.apply, params, ds.x_train, ds.y_train, ds.x_test, ds.y_test,
      examples=examples, seed=seed, epsilon=privacy.get("epsilon"),
      delta=privacy.get("delta"), neighbouring=privacy.get("neighbouring"))
  return {"run": os.path.abspath(run_dir), "dp": cfg.dp, **report,
          "epsilon_accountant": privacy.get("epsilon_accountant")}


def _reported_privacy(run_dir: str) -> dict:
  try:
    with open(os.path.join(run_dir, "summary.json")) as f:
      return json.load(f).get("privacy") or {}
  except (OSError, ValueError):
    return {}


def format_report(report: dict) -> str:
  """The attack's figures, a line each."""
  bound = report["dp_bound_tpr_at_1pct_fpr"]
  eps = report["epsilon"]
  lines = [f"membership inference, loss threshold: {report['members']} members (train) "
           f"and {report['nonmembers']} non-members (test)",
           f"  attack accuracy   {report['accuracy']:.4f}   (chance 0.5)",
           f"  AUC               {report['auc']:.4f}",
           f"  TPR at 1 % FPR    {report['tpr_at_1pct_fpr']:.4f}   " + (
               f"(at most {bound:.4f} under the run's epsilon {eps:.3g}, "
               f"{report['epsilon_accountant']}"
               + (", as a group of 2 clients: Poisson sampling's add/remove relation"
                  if report["dp_bound_steps"] == 2 else "") + ")"
               if bound is not None else
               "(no DP guarantee bounds it)"),
           f"  mean loss         members {report['member_loss_mean']:.4f}, non-members "
           f"{report['nonmember_loss_mean']:.4f}"]
  return "\n".join(lines)
