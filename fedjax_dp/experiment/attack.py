"""Privacy attacks on a finished run's model: `fedjax-dp attack mia --run DIR`.

The run folder gives the config (config.json), the trained parameters
(model.msgpack) and the guarantee it reported (summary.json's privacy block);
the data are rebuilt from the config as the run built them (the same partition,
scaling and, for a data attack, poisoning). Runs on your own data or model take
them again: `attack_mia(run_dir, data=..., model=...)`.
"""

from __future__ import annotations

import json
import math
import os

from fedjax_dp.errors import RunError
from fedjax_dp.privacy.mechanisms import get_mechanism
from fedjax_dp.recipes.flat import kept_noise_of


SHADOW_EPOCHS_MAX = 100


def load_run(run_dir: str, data=None, model=None, caller: str = "load_run"):
  """(config, trained parameters, dataset, simulation) of a finished run, its data
  rebuilt from its config (or `data`, for a run on data of your own). Also the
  adversarial reproduction's (experiments/adversarial/run.py)."""
  from fedjax_dp.experiment.final_model import load_params
  from fedjax_dp.experiment.run_folder import saved_config
  from fedjax_dp.experiment.setup import setup
  cfg = saved_config(os.path.join(run_dir, "config.json"), caller)
  if cfg.algorithm == "solo":
    raise RunError(f"{run_dir}: algorithm 'solo' trains no global model to attack")
  if cfg.dataset == "custom" and data is None:
    raise RunError(f"{run_dir} trained on data of your own: pass it again, "
                   f"{caller}(run_dir, data=...)")
  params = load_params(run_dir)
  ds, _, sim = setup(cfg, data, model=model)
  return cfg, params, ds, sim


def shadow_epochs(cfg) -> int:
  """Central epochs that visit each example as often as the run did on average:
  rounds x (participation rate) x local_epochs, at least 1, at most 100."""
  rate = cfg.clients_per_round / cfg.num_clients
  return int(min(SHADOW_EPOCHS_MAX, max(1, round(cfg.rounds * rate * cfg.local_epochs))))


def attack_mia(run_dir: str, *, examples: int | None = None, seed: int = 0, shadows: int = 0,
               data=None, model=None) -> dict:
  """The loss-threshold membership-inference attack (adversary/membership.py) on the
  model a run saved, and with `shadows` > 0 the shadow-model attack beside it
  (under 'shadow'); the report also names the run and its reported guarantee."""
  from fedjax_dp.adversary import membership
  cfg, params, ds, sim = load_run(run_dir, data, model, "attack_mia")
  if ds.num_classes < 2:
    raise RunError(f"{run_dir}: the loss-threshold attack reads a classifier's "
                   "cross-entropy, and this run's targets are real values")
  if ds.y_train.ndim != 1:
    raise RunError(f"{run_dir}: the loss-threshold attack reads one cross-entropy an "
                   f"example, and this run's targets are token sequences "
                   f"{ds.y_train.shape[1:]} (a per-sequence attack is not built)")
  import numpy as np
  guarantee = membership_privacy(cfg, _reported_privacy(run_dir),
                                 int(np.min(np.asarray(sim.store.client_count))))
  report = membership.loss_threshold_attack(
      sim.model.apply, params, ds.x_train, ds.y_train, ds.x_test, ds.y_test,
      examples=examples, seed=seed, epsilon=guarantee["epsilon"], delta=guarantee["delta"],
      neighbouring=guarantee["neighbouring"], why_none=guarantee["why_none"])
  if shadows:
    report["shadow"] = membership.shadow_attack(
        sim.model, params, ds.x_train, ds.y_train, ds.x_test, ds.y_test, shadows=shadows,
        epochs=shadow_epochs(cfg), batch=cfg.batch_size, lr=cfg.lr, momentum=cfg.momentum,
        examples=examples, seed=seed)
  return {"run": os.path.abspath(run_dir), "dp": cfg.dp, **report,
          "epsilon_accountant": guarantee["epsilon_accountant"]}


def membership_privacy(cfg, privacy: dict, smallest_client: int) -> dict:
  """The (epsilon, delta, neighbouring, epsilon_accountant) that bounds an attack on
  an example's membership, or epsilon None and why_none. Membership changes the
  example's client's data by one example, and so its number of examples n_i.

  User-level DP (central: add/remove or replace one client; local DP: replace one
  client's data) covers any change of one client's data: the run's epsilon. Kept
  noise (dp none) covers each client's uploads, and the model is a function of them
  alone only where the server weights them uniformly (a shuffle), not by n_i
  (FedAvg, no shuffle). Shuffled, `kept_noise: multiplier`'s std does not depend on
  n_i, so its replace-one epsilon (sensitivity 2 final_clip_l2: any two data of a
  client) covers membership; `kept_noise: paper`'s holds only for the same n_i, and
  the report's size_leak is the epsilon of sizes one example apart: the RDP of each
  round's Gaussian pair, means within 2 final_clip_l2 and stds for n and n + 1
  examples together, composed over the rounds, for every client size of the run and
  one either side (not a client of one example left with none)."""
  eps = privacy.get("epsilon")
  own = {"epsilon": eps, "delta": privacy.get("delta"),
         "neighbouring": privacy.get("neighbouring"),
         "epsilon_accountant": privacy.get("epsilon_accountant"), "why_none": None}
  if eps is None:
    return {**own, "why_none": privacy.get("epsilon_why_none") or "the run reports no epsilon"}
  kept = kept_noise_of(cfg)
  if get_mechanism(cfg.dp).private or kept is None:
    return own

  def none(why: str) -> dict:
    return {"epsilon": None, "delta": None, "neighbouring": None, "epsilon_accountant": None,
            "why_none": why}
  if cfg.shuffle == "none":
    return none(f"the kept noise's epsilon {eps:.3g} covers each client's uploads, but without "
                "a shuffle the server weights them by the client's example count n_i (FedAvg), "
                "which adding or removing an example changes outside the noise")
  if not kept.reveals_size:
    return own
  paper = (f"kept_noise {kept.name!r}: its epsilon {eps:.3g} holds only for clients of the same "
           "size n_i, which adding or removing an example changes, and ")
  leak = privacy.get("kept_noise", {}).get("size_leak")
  if leak is None or not leak.get("mean_shift") or not math.isfinite(leak["epsilon"]):
    return none(paper + "the report has no finite size_leak epsilon for sizes one apart")
  if smallest_client < 2:
    return none(paper + "size_leak does not cover a client of one example left with none")
  return {"epsilon": leak["epsilon"], "delta": leak["delta"], "neighbouring": None,
          "epsilon_accountant": "rdp, kept noise per client, add or remove one example "
                                "(size_leak)", "why_none": None}


def attack_attribute(run_dir: str, *, feature: str | None = None, examples: int | None = None,
                     seed: int = 0, data=None, model=None) -> dict:
  """Attribute inference (adversary/attribute.py) on the model a run saved: one
  sensitive column of tabular data, `feature` by name (default: the data's first
  sensitive column with at most 10 values, else its first)."""
  from fedjax_dp.adversary import attribute
  cfg, params, ds, sim = load_run(run_dir, data, model, "attack_attribute")
  if ds.x_train.ndim != 2 or ds.num_classes < 2 or ds.y_train.ndim != 1:
    raise RunError(f"{run_dir}: attribute inference reads a column of tabular data under a "
                   f"classifier; dataset {ds.name!r} has inputs {ds.input_shape} and targets "
                   f"{ds.y_train.shape[1:] or 'labels'}")
  j = _feature_index(run_dir, ds, feature)
  report = attribute.attribute_attack(sim.model.apply, params, ds.x_train, ds.y_train,
                                      ds.x_test, ds.y_test, j, examples=examples, seed=seed)
  privacy = _reported_privacy(run_dir)
  return {"run": os.path.abspath(run_dir), "dp": cfg.dp, "feature": ds.feature_names[j],
          **report, "epsilon": privacy.get("epsilon"),
          "epsilon_accountant": privacy.get("epsilon_accountant")}


def _feature_index(run_dir: str, ds, feature: str | None) -> int:
  import numpy as np
  names = list(ds.feature_names)
  if feature is not None:
    if feature not in names:
      shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
      raise RunError(f"--feature {feature!r}: dataset {ds.name!r} has no such column "
                     f"(its columns: {shown})")
    return names.index(feature)
  if ds.sensitive is None or not np.any(ds.sensitive):
    raise RunError(f"{run_dir}: dataset {ds.name!r} marks no sensitive column; name one "
                   "with --feature")
  cols = np.flatnonzero(ds.sensitive)
  few = [j for j in cols if len(np.unique(ds.x_train[:, j])) <= 10]
  return int(few[0] if few else cols[0])


def format_attribute(report: dict) -> str:
  what = ("quantile bins" if report["binned"] else "values")
  eps = report["epsilon"]
  return "\n".join([
      f"attribute inference of {report['feature']!r} ({len(report['candidates'])} {what}): "
      f"{report['members']} members and {report['nonmembers']} non-members",
      f"  guessed right     members {report['members_success']:.4f}, non-members "
      f"{report['nonmembers_success']:.4f}",
      f"  baseline          {report['baseline_success']:.4f} (always the most common value)",
      f"  run's epsilon     {eps:.3g} ({report['epsilon_accountant']})" if eps is not None
      else "  run's epsilon     none (no DP guarantee)"])


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
               f"(at most {bound:.4f} under epsilon {eps:.3g}, "
               f"{report['epsilon_accountant']}"
               + (", as a group of 2 clients: Poisson sampling's add/remove relation"
                  if report["dp_bound_steps"] == 2 else "") + ")"
               if bound is not None else
               f"(no DP bound: {report['dp_bound_why_none']})"),
           f"  mean loss         members {report['member_loss_mean']:.4f}, non-members "
           f"{report['nonmember_loss_mean']:.4f}"]
  if "shadow" in report:
    s = report["shadow"]
    lines += [f"shadow models: {s['shadows']} trained centrally for {s['shadow_epochs']} "
              "epochs on halves of the training examples outside the evaluated set",
              f"  attack accuracy   {s['accuracy_at_attack_threshold']:.4f}   (at the attack "
              f"model's own threshold; best threshold {s['best_threshold_accuracy']:.4f})",
              f"  AUC               {s['auc']:.4f}",
              f"  TPR at 1 % FPR    {s['tpr_at_1pct_fpr']:.4f}"]
  return "\n".join(lines)
