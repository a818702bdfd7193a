"""Reproduces the dynamic-DP paper's adversarial evaluation (section 4.3.3, Table 5).

  python experiments/adversarial/run.py robustness --dataset fmnist --seeds 0 1 2
  python experiments/adversarial/run.py dp --dataset healthcare --seeds 0 1 2
  python experiments/adversarial/run.py inference --dataset healthcare --seeds 0 1 2
  python experiments/adversarial/run.py table5 --dataset fmnist --seeds 0 1 2   # all three
  options: --attacks A .. --defenses D .. --fractions F .. --grid full|paper --rounds N
           --out DIR --overwrite

Kinds:
  robustness  no DP: every attack at every fraction against every defense, and
              each defense without an attack (the clean rows)
  dp          central DP at the paper's epsilon 1.9 (the accountant's, RDP, delta
              1e-5): the attacks and defenses the accountant covers there; the
              combinations the library refuses are listed with its reason
  inference   membership inference (loss threshold and 4 shadow models) and, on
              the tabular data, attribute inference on the clean model, with and
              without DP
  table5      the three above, then the paper's Table 5 rows beside ours

Protocols (one tree per dataset under --out): healthcare is the dynamic-DP
paper's own (experiments/dynamic_dp/base.yaml: 120 clients, 12 a round) at 450
rounds, the paper's no-privacy run length; fmnist is ours (fmnist.yaml: 3,000
clients of 20 examples, 60 a round), the paper giving none for images.

Defenses, each fixed for every fraction (a server does not know how many attack):
mean (none), median, trimmed_mean (0.3 a side), krum (f = 30 % of a round's
cohort), geometric_median, filtered_mean (gradient filtering, our reading),
norm_bound (the server clips every upload to the DP arm's clip norm). Attacks
(byzantine_scale 10 where read; IPM 0.5): sign_flip, gaussian, alie, ipm,
label_flip, targeted (class 1 to 0), backdoor (boosted 10x: model replacement).

--grid paper (robustness only) runs each attack against no defense and the one
Table 5 pairs with it: the Byzantine attacks against the median at 10 %, the
trimmed mean at 20 %, Krum at 30 %; backdoor against gradient filtering,
targeted against norm bounding, label flipping against the median.

Each kind is a `fedjax-dp sweep` under --out/DATASET/KIND (cells/<name>/ are
ordinary run folders): run again, finished cells are kept, new ones run; a cell
holding other settings is an error unless --overwrite. The whole request is
checked before the first run. KIND.csv, KIND.md and KIND.png are each replaced
whole. Bad input is a one-line error, exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))

from fedjax_dp.placement.host import use_cpu_devices_or_exit  # noqa: E402

use_cpu_devices_or_exit()

import yaml  # noqa: E402

from fedjax_dp import make_config
from fedjax_dp.errors import ConfigError  # noqa: E402
from fedjax_dp.experiment import reporting  # noqa: E402
from fedjax_dp.experiment.batch import add_tree_arguments, check_distinct, claim_tree  # noqa: E402
from fedjax_dp.cli import OneLineParser, exit_with, run_guarded  # noqa: E402

PROTOCOLS = {
    "fmnist": (os.path.join(HERE, "fmnist.yaml"), {}),
    "healthcare": (os.path.join(HERE, "..", "dynamic_dp", "base.yaml"),
                   {"rounds": 450, "eval_every": 75}),
}
ATTACKS = ("sign_flip", "gaussian", "alie", "ipm", "label_flip", "targeted", "backdoor")
DEFENSES = ("mean", "median", "trimmed_mean", "krum", "geometric_median", "filtered_mean",
            "norm_bound")
FRACTIONS = (0.1, 0.2, 0.3)
EPSILON = 1.9                      # the paper's (Table 4, dynamic DP)
DP_ONLY = ("clip_norm",)           # protocol keys only a DP run reads
ATTACK_METRIC = {"backdoor": "attack_success_rate", "targeted": "target_misclassification"}
SHADOWS = 4

# The paper's Table 5, as printed (its data, its protocol): attack, strength,
# accuracy impact, privacy preserved, defense
PAPER_TABLE5 = [
    ("Byzantine", "10% malicious", "-1.2%", "Yes", "Median aggregation", ("byzantine", 0.1, "median")),
    ("Byzantine", "20% malicious", "-2.8%", "Yes", "Trimmed mean", ("byzantine", 0.2, "trimmed_mean")),
    ("Byzantine", "30% malicious", "-8.5%", "Partial", "Krum selection", ("byzantine", 0.3, "krum")),
    ("Inference", "Membership", "N/A", "51.2% success", "DP noise", ("mia",)),
    ("Inference", "Attribute", "N/A", "19.3% success", "DP + clipping", ("attribute",)),
    ("Poisoning", "Backdoor", "-0.5%", "Yes", "Gradient filtering", ("backdoor", None, "filtered_mean")),
    ("Poisoning", "Targeted", "-1.8%", "Yes", "Norm bounding", ("targeted", None, "norm_bound")),
]
PAPER_MIA_NO_DP = 68.4
# --grid paper: the poisoning rows' defenses (Table 5; label flipping: ours, the median)
PAPER_PAIRS = {"backdoor": "filtered_mean", "targeted": "norm_bound", "label_flip": "median"}


def protocol(args) -> dict:
  """The dataset's protocol keys (with the DP arm's clip), --rounds applied."""
  path, overrides = PROTOCOLS[args.dataset]
  with open(path) as f:
    values = dict(yaml.safe_load(f), **overrides)
  if args.rounds:
    values["rounds"] = args.rounds
    values["eval_every"] = max(1, min(values["eval_every"], args.rounds))
  return values


def defense_keys(defense: str, proto: dict) -> dict:
  """The config keys of a defense, the same at every attack fraction."""
  krum_f = math.ceil(max(FRACTIONS) * proto["clients_per_round"])
  return {"mean": {"aggregator": "mean"},
          "median": {"aggregator": "median"},
          "trimmed_mean": {"aggregator": "trimmed_mean", "trim_fraction": max(FRACTIONS)},
          "krum": {"aggregator": "krum", "byzantine_f": krum_f},
          "geometric_median": {"aggregator": "geometric_median"},
          "filtered_mean": {"aggregator": "filtered_mean"},
          "norm_bound": {"server_clip_l2": proto["clip_norm"]}}[defense]


def attack_keys(attack: str, fraction: float) -> dict:
  if attack == "none":
    return {}
  return {"byzantine_attack": attack, "byzantine_fraction": fraction,
          **({"byzantine_scale": 0.5} if attack == "ipm" else {})}


def dp_keys() -> dict:
  return {"dp": "central", "target_epsilon": EPSILON}


def paper_defenses(attack: str, fraction: float) -> tuple[str, ...]:
  """--grid paper: the defense Table 5 pairs with the attack (the Byzantine rows:
  median at 10 %, trimmed mean at 20 %, Krum at 30 %), beside none (mean)."""
  if attack == "none":
    return ("mean", "median", "trimmed_mean", "krum", "filtered_mean", "norm_bound")
  if attack in PAPER_PAIRS:
    return ("mean", PAPER_PAIRS[attack])
  return ("mean", {0.1: "median", 0.2: "trimmed_mean"}.get(fraction, "krum"))


def variants(kind: str, args, proto: dict) -> tuple[list[dict], list[dict]]:
  """(the sweep's variants, the refused combinations as rows with their reason)."""
  dp = kind == "dp"
  if kind == "inference":
    return [{"dp": "none"}, dp_keys()], []
  chosen = [("none", 0.0)] + [(a, f) for a in args.attacks for f in args.fractions]
  out, refused = [], []
  for attack, fraction in chosen:
    paired = paper_defenses(attack, fraction) if args.grid == "paper" and not dp else None
    for defense in args.defenses:
      if paired is not None and defense not in paired:
        continue
      keys = {**attack_keys(attack, fraction), **defense_keys(defense, proto),
              **(dp_keys() if dp else {})}
      if dp:
        try:
          make_config({**proto, **keys, "rounds": 1})
        except ConfigError as e:
          refused.append({"attack": attack, "fraction": fraction, "defense": defense,
                          "refused": str(e)})
          continue
      out.append(keys)
  return out, refused


def sweep_spec(kind: str, args, proto: dict) -> tuple[dict, list[dict]]:
  base = {k: v for k, v in proto.items() if k not in DP_ONLY}
  found, refused = variants(kind, args, proto)
  clip = {k: proto[k] for k in DP_ONLY}
  found = [dict(v, **(clip if v.get("dp", "none") != "none" else {})) for v in found]
  return {"config": base, "seeds": list(args.seeds), "variants": found,
          "replica_batch": 1}, refused


def run_sweep(kind: str, args, proto: dict) -> tuple[list[dict], list[dict]]:
  """Runs (or continues) the kind's sweep; (each cell's row, the refused rows)."""
  import fedjax_dp
  spec, refused = sweep_spec(kind, args, proto)
  out = os.path.join(args.out, args.dataset, kind)
  record = fedjax_dp.sweep(spec, out=out, overwrite=args.overwrite, progress=False,
                           log=lambda m: print(m, flush=True) if "program" in m else None)
  return [cell_row(os.path.join(out, "cells", c["name"])) for c in record["cells"]], refused


def cell_row(path: str) -> dict:
  """One finished cell: what it was (attack, fraction, defense, dp) and what it reached."""
  with open(os.path.join(path, "config.json")) as f:
    cfg = json.load(f)
  with open(os.path.join(path, "summary.json")) as f:
    s = json.load(f)
  attack = cfg["byzantine_attack"] if cfg["byzantine_fraction"] > 0 else "none"
  final = s["final"]
  bounded = cfg.get("server_clip_l2") is not None
  # uploads in the last evaluation window: left out or flagged by the rule; clipped by
  # the norm bound (norm_bounded; runs made before it had a key of its own wrote it
  # as flagged, and norm bounding flags nothing else)
  window = ({"norm_bounded": final.get("norm_bounded", final.get("flagged"))} if bounded
            else {"flagged": final.get("flagged")})
  return {"cell": os.path.basename(path), "attack": attack,
          "fraction": cfg["byzantine_fraction"],
          "defense": "norm_bound" if cfg.get("server_clip_l2") else cfg["aggregator"],
          "dp": cfg["dp"], "seed": cfg["seed"], "diverged": s.get("diverged") is not None,
          "test_accuracy": final.get("test_accuracy"),
          "attack_metric": final.get(ATTACK_METRIC.get(attack, ""), None),
          **{f"{k}_last_window": v for k, v in window.items()},
          "epsilon": final.get("epsilon"), "rounds": final.get("round"),
          "wall_s": s["timing"]["wall_s"]}


def settings(rows: list[dict]) -> list[dict]:
  """Per (attack, fraction, defense): seeds, diverged seeds, and mean / sd over the
  finite seeds of accuracy and the attack's metric."""
  groups: dict[tuple, list[dict]] = {}
  for r in rows:
    groups.setdefault((r["attack"], r["fraction"], r["defense"]), []).append(r)
  out = []
  for (attack, fraction, defense), group in groups.items():
    entry = {"attack": attack, "fraction": fraction, "defense": defense,
             "seeds": len(group), "diverged": sum(r["diverged"] for r in group)}
    for key in ("test_accuracy", "attack_metric", "epsilon"):
      vals = [r[key] for r in group if r[key] is not None and not r["diverged"]]
      entry[f"{key}_mean"] = statistics.fmean(vals) if vals else None
      entry[f"{key}_sd"] = statistics.stdev(vals) if len(vals) > 1 else None
    out.append(entry)
  return out


def clean_attack_rates(kind: str, args, clean: list[str]) -> dict:
  """On each seed's clean, undefended model of the arm (no attack, mean): the share
  of triggered test examples of other classes it puts in the target class (what
  the backdoor's ASR reads) and of source-class test examples it puts in the
  target class (the targeted attack's TMR), means over seeds: the rates an
  attack has to beat. `clean`: those cells' names. Cached in the cell
  (clean_rates.json)."""
  import jax.numpy as jnp
  import numpy as np
  from fedjax_dp.experiment.attack import load_run
  from fedjax_dp.adversary import poisoning
  rates = []
  for cell in clean:
    path = os.path.join(args.out, args.dataset, kind, "cells", cell)
    cache = os.path.join(path, "clean_rates.json")
    cached = json.load(open(cache)) if os.path.exists(cache) else {}
    if cached.get("config") == _config_text(path):
      rates.append(cached)
      continue
    cfg, params, ds, sim = load_run(path)
    got = {"config": _config_text(path)}
    for attack, metric in ATTACK_METRIC.items():
      _, x, y = poisoning.attack_test_set(attack, ds.x_test, ds.y_test,
                                          cfg.attack_source_class, cfg.attack_target_class)
      pred = np.argmax(np.asarray(sim.model.apply(params, jnp.asarray(x))), axis=-1)
      got[metric] = float(np.mean(pred == y))
    reporting.write_json_atomic(cache, got)
    rates.append(got)
  return {name: statistics.fmean(r[name] for r in rates) for name in ATTACK_METRIC.values()}


def _pct(mean, sd=None) -> str:
  if mean is None:
    return "n/a"
  return f"{100 * mean:.1f}" + (f" +- {100 * sd:.1f}" if sd is not None else "")


def _cell_text(s: dict | None, clean: dict | None) -> str:
  """accuracy +- sd (impact against the clean mean), the attack metric, divergence."""
  if s is None:
    return "·"
  if s["test_accuracy_mean"] is None:
    return f"diverged {s['diverged']}/{s['seeds']}"
  text = _pct(s["test_accuracy_mean"], s["test_accuracy_sd"])
  if clean and clean["test_accuracy_mean"] is not None and s["attack"] != "none":
    text += f" ({100 * (s['test_accuracy_mean'] - clean['test_accuracy_mean']):+.1f})"
  if s["attack_metric_mean"] is not None:
    text += f"; {'ASR' if s['attack'] == 'backdoor' else 'TMR'} {_pct(s['attack_metric_mean'])}"
  if s["diverged"]:
    text += f"; diverged {s['diverged']}/{s['seeds']}"
  return text


def robustness_md(kind: str, table: list[dict], refused: list[dict], args,
                  clean: list[str]) -> list[str]:
  by = {(s["attack"], s["fraction"], s["defense"]): s for s in table}
  defenses = list(dict.fromkeys(s["defense"] for s in table))
  clean_mean = by.get(("none", 0.0, "mean"))
  title = ("central DP at accounted epsilon " + str(EPSILON)) if kind == "dp" else "no DP"
  lines = [f"# {kind}: {args.dataset}, {title}, seeds {args.seeds}", "",
           "Each cell: final test accuracy % (mean +- sd over seeds), in brackets its "
           "difference from the clean run with no defense (mean aggregation, no attack); "
           "ASR = backdoor attack success rate %, TMR = targeted class-1-to-0 "
           "misclassification %; 'diverged k/n': k seeds' models stopped being finite "
           "(accuracy over the others); '·': not in the grid asked for (--grid paper: "
           "each attack against no defense and its Table 5 defense).", "",
           "| attack | fraction | " + " | ".join(defenses) + " |",
           "| --- | --- | " + " | ".join("---" for _ in defenses) + " |"]
  for attack, fraction in dict.fromkeys((s["attack"], s["fraction"]) for s in table):
    cells = [_cell_text(by.get((attack, fraction, d)), clean_mean) for d in defenses]
    lines.append(f"| {attack} | {fraction:g} | " + " | ".join(cells) + " |")
  if refused:
    lines += ["", "Refused under central DP (not run; the library's reason):", ""]
    for reason in dict.fromkeys(r["refused"] for r in refused):
      which = sorted({f"{r['attack']} x {r['defense']}" for r in refused
                      if r["refused"] == reason})
      lines.append(f"- {len(which)} combinations ({', '.join(which[:4])}"
                   f"{', ...' if len(which) > 4 else ''}): {reason}")
  if any(s["attack"] in ATTACK_METRIC for s in table):
    base = clean_attack_rates(kind, args, clean)
    lines += ["", "What the attacks have to beat: the clean, undefended model of this arm "
              f"already puts {_pct(base['attack_success_rate'])} % of the triggered test "
              "examples of other classes in class 0 (the backdoor's ASR without a backdoor) "
              f"and {_pct(base['target_misclassification'])} % of class 1 in class 0 (the "
              "targeted attack's TMR without the attack)."]
  if kind == "dp":
    eps = [s["epsilon_mean"] for s in table if s["epsilon_mean"] is not None]
    if eps:
      lines += ["", f"Accounted epsilon at the end: {min(eps):.4g} to {max(eps):.4g} "
                f"(RDP, delta 1e-5; the honest clients' guarantee: README, What the "
                "accountant covers under attack)."]
  return lines


def plot(kind: str, table: list[dict], args) -> str:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  attacks = [a for a in dict.fromkeys(s["attack"] for s in table) if a != "none"]
  panels = [(a, "test_accuracy") for a in attacks] + [
      (a, "attack_metric") for a in attacks if a in ATTACK_METRIC]
  cols = 4
  rows = max(1, math.ceil(len(panels) / cols))
  fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
  defenses = list(dict.fromkeys(s["defense"] for s in table))
  for ax, (attack, key) in zip(axes.flat, panels):
    for d in defenses:
      pts = sorted((s["fraction"], s[f"{key}_mean"], s[f"{key}_sd"] or 0.0) for s in table
                   if s["attack"] == attack and s["defense"] == d
                   and s[f"{key}_mean"] is not None)
      clean = next((s for s in table if s["attack"] == "none" and s["defense"] == d), None)
      if key == "test_accuracy" and clean and clean["test_accuracy_mean"] is not None:
        pts = [(0.0, clean["test_accuracy_mean"], clean["test_accuracy_sd"] or 0.0)] + pts
      if pts:   # one colour per defense in every panel (DEFENSES order)
        ax.errorbar([p[0] for p in pts], [100 * p[1] for p in pts],
                    [100 * p[2] for p in pts], marker="o", ms=3, capsize=2, label=d,
                    color=f"C{DEFENSES.index(d)}")
    ax.set_title(f"{attack}: " + ("test accuracy %" if key == "test_accuracy" else
                                  ATTACK_METRIC[attack].replace("_", " ") + " %"), fontsize=9)
    ax.set_xlabel("malicious fraction")
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(panels):]:
    ax.axis("off")
  axes.flat[0].legend(fontsize=7)
  fig.suptitle(f"{args.dataset}, {kind} (mean +- sd over seeds {args.seeds})")
  fig.tight_layout()
  path = os.path.join(args.out, args.dataset, f"{kind}.png")
  reporting.save_figure_atomic(fig, path, dpi=110)
  plt.close(fig)
  return path


def robustness(kind: str, args) -> dict:
  proto = protocol(args)
  rows, refused = run_sweep(kind, args, proto)
  table = settings(rows)
  clean = [r["cell"] for r in rows if r["attack"] == "none" and r["defense"] == "mean"]
  root = os.path.join(args.out, args.dataset)
  rows = table + refused      # one column set: a refused row has its reason, no figures
  columns = list(dict.fromkeys(k for r in rows for k in r))
  reporting.write_text_atomic(os.path.join(root, f"{kind}.csv"),
                              reporting.csv_text([{k: r.get(k) for k in columns} for r in rows]))
  reporting.write_text_atomic(os.path.join(root, f"{kind}.md"),
                              "\n".join(robustness_md(kind, table, refused, args, clean))
                              + "\n")
  plot(kind, table, args)
  return {"table": table, "refused": refused, "clean": clean}


def inference(kind: str, args) -> dict:
  """MIA (and attribute inference on tabular data) on each seed's clean model,
  with and without DP; each attack's report kept beside the cell (attacks.json)."""
  from fedjax_dp.experiment.attack import attack_attribute, attack_mia
  proto = protocol(args)
  rows, _ = run_sweep(kind, args, proto)
  out = []
  for r in rows:
    path = os.path.join(args.out, args.dataset, kind, "cells", r["cell"])
    report = _cached_attacks(path)
    if report is None:
      report = {"mia": attack_mia(path, shadows=SHADOWS, seed=r["seed"])}
      if args.dataset == "healthcare":
        report["attribute"] = attack_attribute(path, seed=r["seed"])
      report["config"] = _config_text(path)
      reporting.write_json_atomic(os.path.join(path, "attacks.json"), report)
    mia, attr = report["mia"], report.get("attribute")
    out.append({"dp": r["dp"], "seed": r["seed"], "test_accuracy": r["test_accuracy"],
                "epsilon": r["epsilon"], "mia_accuracy": mia["accuracy"], "mia_auc": mia["auc"],
                "mia_tpr_at_1pct_fpr": mia["tpr_at_1pct_fpr"],
                "mia_tpr_bound": mia["dp_bound_tpr_at_1pct_fpr"],
                "shadow_accuracy": mia["shadow"]["accuracy_at_attack_threshold"],
                "shadow_auc": mia["shadow"]["auc"],
                "attribute_feature": attr and attr["feature"],
                "attribute_members": attr and attr["members_success"],
                "attribute_nonmembers": attr and attr["nonmembers_success"],
                "attribute_baseline": attr and attr["baseline_success"]})
  root = os.path.join(args.out, args.dataset)
  reporting.write_text_atomic(os.path.join(root, f"{kind}.csv"), reporting.csv_text(out))
  reporting.write_text_atomic(os.path.join(root, f"{kind}.md"),
                              "\n".join(inference_md(out, args)) + "\n")
  return {"rows": out}


def _config_text(path: str) -> str:
  with open(os.path.join(path, "config.json")) as f:
    return f.read()


def _cached_attacks(path: str) -> dict | None:
  """attacks.json if it was made from the cell's present config, else None."""
  try:
    with open(os.path.join(path, "attacks.json")) as f:
      report = json.load(f)
  except (OSError, ValueError):
    return None
  return report if report.get("config") == _config_text(path) else None


def _mean_sd(rows: list[dict], key: str) -> tuple:
  vals = [r[key] for r in rows if r.get(key) is not None]
  return ((statistics.fmean(vals) if vals else None),
          (statistics.stdev(vals) if len(vals) > 1 else None))


def inference_md(rows: list[dict], args) -> list[str]:
  lines = [f"# inference: {args.dataset}, seeds {args.seeds}", "",
           "The clean model (no attack, mean aggregation), without DP and with central DP at "
           f"accounted epsilon {EPSILON}. Membership inference over a balanced set of training "
           "(members) and test (non-members) examples: the loss-threshold attack (accuracy at "
           f"its best threshold, AUC, TPR at 1 % FPR) and {SHADOWS} shadow models trained "
           "centrally (accuracy at the attack model's threshold). Mean +- sd over seeds, %.", ""]
  lines += ["| DP | test accuracy | epsilon | MIA accuracy | MIA AUC | TPR at 1 % FPR "
            "(DP bound) | shadow MIA accuracy | paper: MIA success |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
  for dp in ("none", "central"):
    g = [r for r in rows if r["dp"] == dp]
    if not g:
      continue
    eps = _mean_sd(g, "epsilon")[0]
    bound = _mean_sd(g, "mia_tpr_bound")[0]
    lines.append(
        f"| {dp} | {_pct(*_mean_sd(g, 'test_accuracy'))} | "
        f"{'none' if eps is None else f'{eps:.3g}'} | {_pct(*_mean_sd(g, 'mia_accuracy'))} | "
        f"{_pct(*_mean_sd(g, 'mia_auc'))} | {_pct(*_mean_sd(g, 'mia_tpr_at_1pct_fpr'))} "
        f"({'none' if bound is None else _pct(bound)}) | "
        f"{_pct(*_mean_sd(g, 'shadow_accuracy'))} | "
        f"{'51.2' if dp == 'central' else PAPER_MIA_NO_DP} |")
  if any(r["attribute_feature"] for r in rows):
    lines += ["", f"Attribute inference of {rows[0]['attribute_feature']!r} from the model's "
              "outputs and the other features (share guessed right; baseline: always the "
              "most common value):", "",
              "| DP | members | non-members | baseline | paper: attribute success |",
              "| --- | --- | --- | --- | --- |"]
    for dp in ("none", "central"):
      g = [r for r in rows if r["dp"] == dp]
      if g:
        lines.append(f"| {dp} | {_pct(*_mean_sd(g, 'attribute_members'))} | "
                     f"{_pct(*_mean_sd(g, 'attribute_nonmembers'))} | "
                     f"{_pct(*_mean_sd(g, 'attribute_baseline'))} | "
                     f"{'19.3 (with DP)' if dp == 'central' else 'n/a'} |")
  return lines


def table5(kind: str, args) -> dict:
  """The paper's rows beside ours, without and with DP, from the other kinds."""
  res = {k: KINDS[k](k, args) for k in ("robustness", "dp", "inference")}
  lines = [f"# Table 5: {args.dataset}, seeds {args.seeds}", "",
           "The paper's rows (its data and protocol, as printed) beside ours. Ours: final "
           "test accuracy %, in brackets the change from the clean, undefended run of the "
           "same arm. 'Byzantine' is the paper's 'f malicious clients sending arbitrary "
           "gradients': here the Gaussian attack (N(0, 10^2) per coordinate), the worst of "
           "our four model attacks beside it. DP = central DP at accounted epsilon "
           f"{EPSILON}; a defense the accountant cannot cover there is refused, and the DP "
           "column then shows DP's own clipping with the server's norm bound (mean).", "",
           "| attack | strength | defense | paper: accuracy impact / privacy | ours, no DP | "
           "ours, worst model attack, no DP | ours, DP (defense or DP + norm bound) |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
  rob = {(s["attack"], s["fraction"], s["defense"]): s for s in res["robustness"]["table"]}
  dpt = {(s["attack"], s["fraction"], s["defense"]): s for s in res["dp"]["table"]}
  model_attacks = [a for a in ("sign_flip", "gaussian", "alie", "ipm") if a in args.attacks]
  for kind_, strength, impact, private, defense, ours in PAPER_TABLE5:
    paper = f"{impact} / {private}"
    if ours[0] == "byzantine":
      _, f, d = ours
      clean, clean_dp = rob.get(("none", 0.0, "mean")), dpt.get(("none", 0.0, "mean"))
      worst = min((rob[(a, f, d)] for a in model_attacks if (a, f, d) in rob),
                  key=lambda s: s["test_accuracy_mean"] if s["test_accuracy_mean"] is not None
                  else -1, default=None)
      dp_cell = dpt.get(("gaussian", f, d)) or dpt.get(("gaussian", f, "norm_bound"))
      lines.append(f"| {kind_} | {strength} | {defense} | {paper} | "
                   f"{_cell_text(rob.get(('gaussian', f, d)), clean)} | "
                   f"{(worst['attack'] + ': ' + _cell_text(worst, clean)) if worst else 'n/a'} | "
                   f"{_cell_text(dp_cell, clean_dp)} |")
    elif ours[0] in ("backdoor", "targeted"):
      attack, _, d = ours
      clean, clean_dp = rob.get(("none", 0.0, "mean")), dpt.get(("none", 0.0, "mean"))
      for f in args.fractions:
        dp_cell = dpt.get((attack, f, d)) or dpt.get((attack, f, "norm_bound"))
        lines.append(f"| {kind_} | {strength} {int(100 * f)}% | {defense} | {paper} | "
                     f"{_cell_text(rob.get((attack, f, d)), clean)} | | "
                     f"{_cell_text(dp_cell, clean_dp)} |")
    else:
      inf = res["inference"]["rows"]
      key = "mia_accuracy" if ours[0] == "mia" else "attribute_members"
      no_dp = [r for r in inf if r["dp"] == "none"]
      with_dp = [r for r in inf if r["dp"] == "central"]
      if ours[0] == "attribute" and not any(r["attribute_feature"] for r in inf):
        lines.append(f"| {kind_} | {strength} | {defense} | {paper} | n/a (images: no "
                     "tabular attribute) | | n/a |")
        continue
      ref = ("chance 50.0" if ours[0] == "mia" else
             f"baseline {_pct(_mean_sd(inf, 'attribute_baseline')[0])}")
      lines.append(f"| {kind_} | {strength} | {defense} | {paper} | "
                   f"{_pct(*_mean_sd(no_dp, key))} success ({ref}) | | "
                   f"{_pct(*_mean_sd(with_dp, key))} success ({ref}) |")
  if any(a in args.attacks for a in ATTACK_METRIC):
    for arm in ("robustness", "dp"):
      base = clean_attack_rates(arm, args, res[arm]["clean"])
      lines.append(f"\nThe clean, undefended model {'without' if arm == 'robustness' else 'with'}"
                   f" DP already scores ASR {_pct(base['attack_success_rate'])} and TMR "
                   f"{_pct(base['target_misclassification'])}: what the attacks have to beat.")
  lines += ["", "Attribute inference guesses the sensitive feature right for members "
            "(training examples); the baseline always guesses its most common value. The "
            "paper's 19.3 % has no baseline beside it."] if args.dataset == "healthcare" else []
  root = os.path.join(args.out, args.dataset)
  reporting.write_text_atomic(os.path.join(root, "table5.md"), "\n".join(lines) + "\n")
  return res


KINDS = {"robustness": robustness, "dp": robustness, "inference": inference, "table5": table5}


def build_parser() -> OneLineParser:
  ap = OneLineParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("kind", choices=list(KINDS))
  ap.add_argument("--dataset", default="fmnist", choices=list(PROTOCOLS))
  ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
  ap.add_argument("--attacks", nargs="+", choices=ATTACKS, default=list(ATTACKS))
  ap.add_argument("--defenses", nargs="+", choices=DEFENSES, default=list(DEFENSES))
  ap.add_argument("--fractions", nargs="+", type=float, default=list(FRACTIONS))
  ap.add_argument("--rounds", type=int, default=0, help="rounds per run (0: the protocol's)")
  ap.add_argument("--grid", default="full", choices=["full", "paper"],
                  help="robustness: every attack x fraction x defense (full), or each attack "
                       "against no defense and the one Table 5 pairs with it (paper)")
  add_tree_arguments(ap, os.path.join("runs", "adversarial"),
                     "one folder per dataset below it", "experiments/adversarial/results")
  return ap


def main(argv=None):
  ap = build_parser()
  args = ap.parse_args(argv)
  check_distinct(ap, args, ("seeds", "attacks", "defenses", "fractions"))
  bad = [f for f in args.fractions if not 0 < f < 0.5]
  if bad:
    ap.error(f"--fractions {bad[0]:g}: a malicious fraction is in (0, 0.5)")
  if args.rounds < 0:
    ap.error(f"--rounds {args.rounds}: a positive number of rounds (0: the protocol's)")
  if "mean" not in args.defenses:
    ap.error("--defenses: 'mean' (no defense) must be among them: every cell is read "
             "against the clean, undefended run")
  args.fractions = sorted(args.fractions)

  def go():
    claim_tree(os.path.join(args.out, args.dataset),
               {"experiment": "adversarial", "dataset": args.dataset})
    KINDS[args.kind](args.kind, args)
    print(f"results: {os.path.join(args.out, args.dataset)}")
    return 0
  return run_guarded(go)


if __name__ == "__main__":
  exit_with(main())
