"""The config keys' reference, generated from their definitions: each key's default
(Config), allowed values (CHOICES, RANGES, the optional keys, the registries of
algorithms and aggregation rules), what turns it on (checks.read_condition) and a
one-line meaning (MEANINGS, here). `fedjax-dp config` prints it, and the README's
key table is this module's markdown, checked equal by a test so the two cannot
drift (`python -m fedjax_dp.experiment.config_reference README.md` rewrites the table).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from fedjax_dp.config.schema import _FIELDS, _OPTIONAL, CHOICES, PRESETS, RANGES, Config

# the sections the reference lists keys under, in Config's field order
SECTIONS: dict[str, tuple[str, ...]] = {
    "data": ("dataset", "data_dir", "csv_path", "tier_map_path", "label_column",
             "synthetic_examples", "synthetic_features", "synthetic_classes",
             "healthcare_examples", "healthcare_generator", "feature_scaling"),
    "federation": ("num_clients", "clients_per_round", "sampling", "max_cohort", "partition",
                   "alpha", "classes_per_client", "quantity_alpha"),
    "model": ("model", "hidden"),
    "local training": ("local_epochs", "batch_size", "lr", "lr_schedule", "lr_min", "momentum"),
    "algorithm and server": (
        "algorithm", "server_optimizer", "server_lr", "server_momentum", "server_beta1",
        "server_beta2", "server_eps", "prox_mu", "contrastive_form", "contrastive_mu1",
        "contrastive_mu2", "contrastive_radius", "contrastive_tau", "moon_mu", "moon_tau",
        "admm_rho", "admm_upload", "feddyn_alpha"),
    "update pipeline (top-k, kept noise, shuffling)": (
        "s_local", "s_global", "index_selection", "topk_kernel", "error_feedback",
        "coordinate_clip", "update_clip_l2", "final_clip_l2", "kept_noise",
        "kept_noise_multiplier", "kept_noise_draw", "ldp_epsilon", "ldp_delta", "shuffle"),
    "aggregation and Byzantine clients": (
        "aggregator", "trim_fraction", "byzantine_f", "multi_krum_m", "outlier_z",
        "filter_cosine",
        "cluster_threshold", "cluster_noise", "geomed_iters", "geomed_eps", "cclip_tau",
        "cclip_iters", "byzantine_fraction", "byzantine_attack", "byzantine_scale",
        "byzantine_draw", "attack_source_class", "attack_target_class", "backdoor_fraction",
        "server_clip_l2"),
    "differential privacy": (
        "dp", "clip_norm", "noise_multiplier", "target_epsilon", "delta", "accountant",
        "clip_parts", "rest_tier", "tier_noise_multipliers", "adaptive_clipping",
        "target_quantile", "clip_lr", "clip_count_stddev", "audit_canaries",
        "audit_canary_scale"),
    "dynamic DP (sensitivity tiers, adaptive noise, budgets)": (
        "tier_source", "analyzer_rule", "analyzer_steps", "noise_schedule",
        "convergence_measure", "convergence_lambda", "convergence_window", "convergence_beta",
        "noise_ema", "client_budgets"),
    "run": ("rounds", "eval_every", "seed", "data_seed", "noise_seed", "checkpoint_every",
            "keep_checkpoints", "eval_batch_size"),
    "devices and memory": ("devices", "client_parallelism", "client_batch",
                           "client_state_store", "client_state_dtype", "client_state_dir",
                           "matmul_precision"),
}

# one line per key: what it is, what its values mean; the README section with more
MEANINGS: dict[str, str] = {
    # data
    "dataset": "the data (see Datasets); custom: your own, given to fedjax_dp.run",
    "data_dir": "folder searched first for dataset files; null: the usual places",
    "csv_path": "the CSV file",
    "tier_map_path": "a feature,tier CSV or a JSON object: each column's sensitivity tier",
    "label_column": "the label's column",
    "synthetic_examples": "examples drawn",
    "synthetic_features": "features per example",
    "synthetic_classes": "classes",
    "healthcare_examples": "patients drawn by the generator",
    "healthcare_generator": "logits: classes from noisy logits of a few features (hard to "
                            "learn); severity: a latent disease severity the clinical and "
                            "imaging markers measure (an MLP learns it to ~96 %)",
    "feature_scaling": "how tabular features are standardised; auto: pooled without DP, "
                       "per_client under DP",
    # federation
    "num_clients": "clients in the population",
    "clients_per_round": "cohort size (Poisson sampling: the expected size)",
    "sampling": "fixed: uniform without replacement; poisson: each client with q = "
                "clients_per_round / num_clients",
    "max_cohort": "Poisson cohort capacity (overflow counted in summary.json); null: mean + 4 sd",
    "partition": "how examples are split over clients",
    "alpha": "Dirichlet concentration of the label skew (smaller: more skew)",
    "classes_per_client": "classes per client",
    "quantity_alpha": "Dirichlet concentration over client sizes",
    # model
    "model": "mlp with `hidden` layers, or a 2 conv + 2 dense CNN (hidden[0] = dense width); "
             "custom: your own, given to fedjax_dp.run",
    "hidden": "hidden layer sizes",
    # local training
    "local_epochs": "local epochs E per round",
    "batch_size": "local minibatch size (an epoch's last batch may be short)",
    "lr": "client learning rate",
    "lr_schedule": "constant, or cosine annealing over `rounds` to lr_min",
    "lr_min": "the cosine schedule's final learning rate",
    "momentum": "client SGD momentum",
    # algorithm and server
    "algorithm": "the federated algorithm, or a +-joined combination of local terms (see "
                 "Algorithms)",
    "server_optimizer": "auto: momentum for fedavgm, adam for fedadam, else sgd",
    "server_lr": "server learning rate",
    "server_momentum": "the momentum server optimizer's momentum",
    "server_beta1": "the adam server optimizer's beta1",
    "server_beta2": "the adam server optimizer's beta2",
    "server_eps": "the adam server optimizer's epsilon",
    "prox_mu": "FedProx's proximal weight",
    "contrastive_form": "TopkSDP-FL's contrastive term: bounded (the paper's) or moon_params",
    "contrastive_mu1": "weight of the pull towards the global model",
    "contrastive_mu2": "weight of the push from the previous model",
    "contrastive_radius": "the bounded form's push radius",
    "contrastive_tau": "the moon_params form's temperature",
    "moon_mu": "MOON's contrastive weight",
    "moon_tau": "MOON's temperature",
    "admm_rho": "FedADMM's penalty",
    "admm_upload": "what a FedADMM client uploads: augmented (delta + y_i / rho: its augmented "
                   "model less w^t) or change (delta + the dual's change / rho = 2 delta: the "
                   "authors' code)",
    "feddyn_alpha": "FedDyn's regulariser weight",
    # update pipeline
    "s_local": "upload sparsity: fraction of coordinates each client drops (0: dense)",
    "s_global": "broadcast sparsity: fraction of the global update's coordinates dropped",
    "index_selection": "which coordinates an upload keeps: largest, random, or public top-k",
    "topk_kernel": "how the top-k is found: exact sort, approx, threshold or bisection",
    "error_feedback": "carry each client's dropped coordinates into its next upload",
    "coordinate_clip": "clip each upload coordinate to [-c, c]; null: no clip",
    "update_clip_l2": "clip each upload to this L2 norm before top-k; null: no clip",
    "final_clip_l2": "clip the sent (sparse) upload to this L2 norm; null: no clip",
    "kept_noise": "Gaussian noise on the kept coordinates: the paper's calibration, or a "
                  "multiplier",
    "kept_noise_multiplier": "kept_noise multiplier: the noise std over the clip",
    "kept_noise_draw": "who draws kept noise: each client, or one draw for the aggregate; "
                       "auto picks",
    "ldp_epsilon": "kept_noise paper: per-round client epsilon of the paper's calibration",
    "ldp_delta": "delta of the per-round client guarantee",
    "shuffle": "layerwise: the shuffler permutes uploads per layer (TopkSDP-FL)",
    # aggregation
    "aggregator": "the server's aggregation rule (see Robust aggregation)",
    "trim_fraction": "fraction trimmed at each end",
    "byzantine_f": "the number of Byzantine clients assumed",
    "multi_krum_m": "updates averaged (0: cohort - f)",
    "outlier_z": "robust z-score above which an update is an outlier (outlier_median: of its "
                 "distance to the median; filtered_mean: of its norm)",
    "filter_cosine": "filtered_mean: an update whose cosine with the coordinate-wise median is "
                     "below this is dropped",
    "cluster_threshold": "cosine similarity that joins two updates",
    "cluster_noise": "cluster with local DP: equalize gives each cluster a median cluster's "
                     "noise",
    "geomed_iters": "Weiszfeld steps after the weighted mean",
    "geomed_eps": "smoothing of the distances",
    "cclip_tau": "clipping radius",
    "cclip_iters": "clipping steps per round",
    "byzantine_fraction": "fraction of clients that are Byzantine (floor of fraction x "
                          "num_clients)",
    "byzantine_attack": "what Byzantine clients send (alie, ipm: colluding, from the round's "
                        "honest uploads; see Robust aggregation and Byzantine clients)",
    "byzantine_scale": "the attack's scale (sign_flip, scaled, ipm: factor; gaussian: std; "
                       "backdoor: the upload's boost, model replacement; 1: none)",
    "audit_canaries": "clients whose upload is a fixed random direction of norm clip_norm, "
                      "for an empirical privacy audit (fedjax-dp audit)",
    "audit_canary_scale": "the canaries' uploads are this times clip_norm times their "
                          "direction (0: they take no part; the multi-run audit's runs)",
    "server_clip_l2": "norm bounding: the server clips every upload it receives to this L2 "
                      "norm before the aggregation rule; null: off",
    "attack_source_class": "targeted poisoning: the class the malicious clients relabel",
    "attack_target_class": "targeted poisoning and backdoor: the class they relabel to",
    "backdoor_fraction": "backdoor: the share of a malicious client's examples that carry the "
                         "trigger",
    "byzantine_draw": "which clients are Byzantine: fixed (drawn once from data_seed) or "
                      "round (drawn afresh each round)",
    # differential privacy
    "dp": "central: the server noises the clipped sum; local: each client noises its own "
          "update (see Private training)",
    "clip_norm": "L2 clip of each client's update (adaptive clipping: the initial norm)",
    "noise_multiplier": "noise std / clip_norm; null: calibrated to target_epsilon",
    "target_epsilon": "the privacy budget: calibrates the noise, or stops the run before "
                      "passing it",
    "delta": "the guarantee's delta",
    "accountant": "rdp; pld adds dp-accounting's tighter PLD figure",
    "clip_parts": "clip the update whole, per layer, or per sensitivity tier",
    "rest_tier": "tier of the parameters outside the first layer's rows",
    "tier_noise_multipliers": "noise factors of high, medium, low, public, "
                              "metadata",
    "adaptive_clipping": "move clip_norm towards a quantile of the update norms (central DP)",
    "target_quantile": "the quantile of update norms aimed at",
    "clip_lr": "the geometric step of the clip norm",
    "clip_count_stddev": "std of the unclipped count's noise; null: "
                         "m/20, raised for small cohorts",
    # dynamic DP
    "tier_source": "where feature tiers come from: the data's metadata, or the sensitivity "
                   "analyzer",
    "analyzer_rule": "which analyzer score sets the tiers: semantic (the most accurate), "
                     "fused (the paper's), statistical",
    "analyzer_steps": "training steps of the analyzer's semantic network",
    "noise_schedule": "static noise, or the convergence / weighted adaptive schedules",
    "convergence_measure": "what the convergence score reads: update differences or norm "
                           "differences",
    "convergence_lambda": "the convergence score's lambda",
    "convergence_window": "rounds in the convergence score's window",
    "convergence_beta": "noise reduction at full convergence",
    "noise_ema": "EMA weight of the convergence score's controller",
    "client_budgets": "local DP with target_epsilon: uniform, or the paper's per-client "
                      "allocation",
    # run
    "rounds": "federated rounds",
    "eval_every": "evaluation (and metrics line) period in rounds",
    "seed": "model initialisation; with the release's settings and data, the run key: cohorts, "
            "local training, noise (and the data's, unless data_seed)",
    "data_seed": "the data's split, the partition, the Byzantine clients, the analyzer; null: "
                 "seed (a sweep's seeds share it, so they differ only in the seed)",
    "noise_seed": "secret: the run key comes from the operating system, never from seed",
    "checkpoint_every": "checkpoint period in rounds; 0: none",
    "keep_checkpoints": "checkpoints kept",
    "eval_batch_size": "examples per evaluation batch",
    # devices and memory
    "devices": "devices in the clients mesh; 0: all",
    "client_parallelism": "how a device runs its clients: a loop (map), batched (vmap), or "
                          "one gradient step (one_step); auto picks",
    "client_batch": "clients per group (map, vmap) or chunk (one_step); 0: the mode's default (see "
                    "Performance and scale)",
    "client_state_store": "where per-client state lives: on the device, in host memory, or "
                          "on disk",
    "client_state_dtype": "host or disk table's storage type for float leaves",
    "client_state_dir": "disk table's folder; null: the system's temporary folder",
    "matmul_precision": "matrix products of training and evaluation: float32 (the CPU's numbers "
                        "on any device), or tensorfloat32 (an NVIDIA GPU's tensor cores round "
                        "the inputs to 10 bits: faster, ~1e-3 relative error; same as float32 "
                        "on CPU). Aggregation is float32 either way",
}

# limits that involve another key (checked in checks.py), shown beside the range
_LIMITS = {
    "clients_per_round": "<= num_clients",
    "max_cohort": ">= clients_per_round",
    "lr_min": "<= lr",
    "delta": "< 1 / num_clients under dp",
    "ldp_delta": "< 1 / num_clients with kept noise",
}

# allowed values stated by hand where the range alone would mislead
_ALLOWED = {"noise_multiplier": "0, or >= 1e-6 (below it the accountant overflows)"}


@dataclasses.dataclass(frozen=True)
class KeyReference:
  """What `fedjax-dp config --show KEY` prints for one key."""
  key: str
  section: str
  default: str        # as written in YAML
  allowed: str
  meaning: str
  read_with: str | None   # the setting that makes the key read; None: always read
  presets: str | None     # defaults an algorithm brings, e.g. "topksdp: 0.9"

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def show_value(value: Any) -> str:
  """A default as it is written in YAML: null, true, [200, 200], 1e-05."""
  if value is None:
    return "null"
  if isinstance(value, bool):
    return str(value).lower()
  if isinstance(value, (tuple, list)):
    return "[" + ", ".join(show_value(v) for v in value) + "]"
  if isinstance(value, float):
    return f"{value:g}"
  return str(value)


def _show_bound(v: float, is_int: bool) -> str:
  return str(int(v)) if is_int else f"{v:g}"


def allowed_values(key: str) -> str:
  """The key's allowed values, from its choices, range, type and optionality."""
  kind = _OPTIONAL.get(key, type(getattr(Config(), key)))
  if key in _ALLOWED:
    text = _ALLOWED[key]
  elif key == "aggregator":
    from fedjax_dp.robust import AGGREGATORS
    text = ", ".join(AGGREGATORS)
  elif key == "algorithm":
    from fedjax_dp.algorithms.registry import ALGORITHMS
    text = ", ".join(ALGORITHMS) + "; or local terms joined by +"
  elif key in CHOICES:
    text = ", ".join(CHOICES[key])
  elif key in RANGES:
    text = _range_text(key, kind is int)
  elif key == "hidden":
    text = "a list of integers >= 1"
  elif key == "tier_noise_multipliers":
    text = "5 numbers > 0"
  elif kind is bool:
    text = "true, false"
  elif key.endswith(("_path", "_dir")):
    text = "a path"
  elif kind is str:
    text = "a string"
  else:
    text = {int: "an integer", float: "a number"}[kind]
  if key in _LIMITS:
    text += f"; {_LIMITS[key]}"
  if key in _OPTIONAL and "path" not in text:
    text += "; or null"
  elif key in _OPTIONAL:
    text += " or null"
  return text


def _range_text(key: str, is_int: bool) -> str:
  lo, hi, lo_inc, hi_inc = RANGES[key]
  if lo is not None and hi is not None:
    if is_int:   # whole numbers: both ends inclusive
      return f"{int(lo) if lo_inc else int(lo) + 1}..{int(hi) if hi_inc else int(hi) - 1}"
    return (f"{'[' if lo_inc else '('}{_show_bound(lo, False)}, "
            f"{_show_bound(hi, False)}{']' if hi_inc else ')'}")
  if lo is not None:
    return f"{'>=' if lo_inc else '>'} {_show_bound(lo, is_int)}"
  return f"{'<=' if hi_inc else '<'} {_show_bound(hi, is_int)}"


def section_of(key: str) -> str:
  for title, keys in SECTIONS.items():
    if key in keys:
      return title
  raise KeyError(key)


def reference(key: str) -> KeyReference:
  """The reference of one config key (KeyError for an unknown key)."""
  from fedjax_dp.config.checks import read_condition
  if key not in _FIELDS:
    raise KeyError(key)
  presets = [f"{name}: {show_value(p[key])}" for name, p in PRESETS.items() if key in p]
  return KeyReference(key=key, section=section_of(key), default=show_value(getattr(Config(), key)),
                      allowed=allowed_values(key), meaning=MEANINGS[key],
                      read_with=read_condition(key), presets="; ".join(presets) or None)


def all_references() -> list[KeyReference]:
  """Every key, by section."""
  return [reference(k) for keys in SECTIONS.values() for k in keys]


def listing() -> str:
  """`fedjax-dp config`: one line per key (key, default, allowed -- meaning), by
  section, so that `fedjax-dp config | grep noise` finds a key."""
  refs = all_references()
  shown = {r.key: r.default + (f" ({r.presets})" if r.presets else "") for r in refs}
  width = max(len(r.key) for r in refs) + 2
  dwidth = max(len(d) for d in shown.values()) + 2
  lines = []
  for title, keys in SECTIONS.items():
    lines.append(f"# {title}")
    for r in (reference(k) for k in keys):
      lines.append(f"{r.key:<{width}}{shown[r.key]:<{dwidth}}{r.allowed}  -- {r.meaning}")
    lines.append("")
  return "\n".join(lines).rstrip() + "\n"


def detail(key: str) -> str:
  """`fedjax-dp config --show KEY`: one key in full."""
  r = reference(key)
  rows = [("section", r.section), ("default", r.default)]
  if r.presets:
    rows.append(("presets", r.presets))
  rows += [("allowed", r.allowed), ("read", f"with {r.read_with}" if r.read_with else "always"),
           ("meaning", r.meaning)]
  return key + "\n" + "".join(f"  {name + ':':<9} {text}\n" for name, text in rows)


def _cell(text: str) -> str:
  return text.replace("|", "\\|")


def markdown() -> str:
  """The README's key table: one table per section, one row per key."""
  out = []
  for title, keys in SECTIONS.items():
    out += [f"**{title[0].upper() + title[1:]}**", "",
            "| key | default | allowed | read only with | meaning |",
            "| --- | --- | --- | --- | --- |"]
    for r in (reference(k) for k in keys):
      default = f"`{r.default}`" + (f" ({r.presets})" if r.presets else "")
      cells = (f"`{r.key}`", default, r.allowed, r.read_with or "", r.meaning)
      out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    out.append("")
  return "\n".join(out)


BEGIN = "<!-- config keys: generated by `python -m fedjax_dp.experiment.config_reference README.md` -->"
END = "<!-- end of generated config keys -->"


def readme_with_table(text: str) -> str:
  """`text` (the README) with the generated table between BEGIN and END."""
  head, sep, rest = text.partition(BEGIN)
  _, sep2, tail = rest.partition(END)
  if not sep or not sep2:
    raise ValueError(f"the README has no {BEGIN!r} ... {END!r} block")
  return head + BEGIN + "\n\n" + markdown() + "\n" + END + tail


def main(argv: list[str]) -> int:
  """Rewrites the README's generated key table in place."""
  if len(argv) != 1:
    print("usage: python -m fedjax_dp.experiment.config_reference README.md", file=sys.stderr)
    return 2
  with open(argv[0]) as f:
    text = f.read()
  new = readme_with_table(text)
  if new != text:
    with open(argv[0], "w") as f:
      f.write(new)
  print(f"{argv[0]}: config key table {'updated' if new != text else 'already current'}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
