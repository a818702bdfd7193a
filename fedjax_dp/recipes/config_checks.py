"""The checks of a Config that need the package's stages and registries, run at the
edge (fedjax_dp.make_config, load_config) after config/'s own (config.parse_config:
each key, the population, a stage's numbers): the registered names, the kept noise, an attack
against the mechanism's trust boundary, the algorithm, which stages combine (the
recipe's validate), the client-state store, the data, and a key set away from its
default that nothing of the run reads. Each raises ConfigError with one line.
"""

from __future__ import annotations

from typing import Any

from fedjax_dp import robust
from fedjax_dp.algorithms import parse_algorithm
from fedjax_dp.algorithms.registry import TERMS
from fedjax_dp.config import (PLD_MIN_NOISE_MULTIPLIER, Config, _coerce, parse_config,
                              parse_set, read_config_file)
from fedjax_dp.data import DATASETS, TABULAR
from fedjax_dp.models.registry import reads_hidden
from fedjax_dp.errors import ConfigError
from fedjax_dp.placement.participation import RANDOM_COHORTS, TAKES_SEPARATION
from fedjax_dp.privacy import boundary, mechanisms
from fedjax_dp.privacy.mechanisms import kept_noise
from fedjax_dp.recipes import flat
from fedjax_dp.recipes import privacy as privacy_setup
from fedjax_dp.recipes.plugins import load_plugins
from fedjax_dp.adversary import attacks


def make_config(overrides: dict[str, Any] | None = None, base: Config | None = None,
                refuse_unread: bool = True) -> Config:
  """Returns a checked Config: `base` (or the defaults) with `overrides` applied
  (config.parse_config: presets, coercion, each key and the population), then the
  run's stages checked (check_run). A key of `overrides` away from its default that
  nothing of the run reads is a ConfigError unless not `refuse_unread` (a saved
  config, checked when it was written)."""
  return checked_config(overrides, base, refuse_unread)[0]


def checked_config(overrides: dict[str, Any] | None = None, base: Config | None = None,
                   refuse_unread: bool = True):
  """make_config's (Config, and the recipe its checks built from it)."""
  _load_named_plugins(overrides, base)   # their keys are names parse_config then accepts
  cfg = parse_config(overrides, base)
  return cfg, check_run(cfg, dict(overrides or {}), refuse_unread)


def _load_named_plugins(overrides: dict[str, Any] | None, base: Config | None) -> None:
  """Imports the plugins the config will list (overrides', else base's)."""
  raw = (overrides or {}).get("plugins", base.plugins if base is not None else ())
  try:
    plugins = _coerce("plugins", raw)
  except ConfigError:
    return   # parse_config says what is wrong with the value
  load_plugins(plugins)


def load_config(path: str | None = None, sets: list[str] | None = None) -> Config:
  """Defaults, then the YAML file at `path`, then `key=value` overrides, checked."""
  return make_config({**(read_config_file(path) if path else {}), **parse_set(sets or [])})


def check_run(cfg: Config, raw: dict[str, Any], refuse_unread: bool = True):
  """Raises ConfigError for the first problem of `cfg`'s stages, shown as the user
  wrote it (`raw`); then a key of `raw` set away from its default that nothing of
  this run reads (unless not `refuse_unread`). Returns the recipe it checked."""
  load_plugins(cfg.plugins)   # before the names they register are checked
  _check_registered(cfg)
  _check_kept_noise(cfg, raw)
  _check_mechanism(cfg, raw)
  _check_participation(cfg)
  _check_attack_placement(cfg)
  recipe = _check_stages(cfg)
  _check_client_state_store(cfg)
  _check_data(cfg)
  if refuse_unread:
    _check_unread(cfg, raw, recipe)
  return recipe


def _private(cfg: Config) -> bool:
  return mechanisms.get_mechanism(cfg.dp).private


def _check_registered(cfg: Config) -> None:
  """A key whose values are a registry's names (config.CHOICES lists it empty)."""
  if cfg.dataset not in DATASETS and cfg.dataset != "custom":
    raise ConfigError(f"config key 'dataset' = {cfg.dataset!r}: allowed values are "
                      f"{', '.join(DATASETS)}, custom")
  if cfg.dp not in mechanisms.MECHANISMS:
    raise ConfigError(f"config key 'dp' = {cfg.dp!r}: allowed values are "
                      f"{', '.join(mechanisms.MECHANISMS)}")
  flat.kept_noise_of(cfg)   # its ConfigError names the registered calibrations
  if cfg.aggregator not in robust.AGGREGATORS:
    raise ConfigError(f"config key 'aggregator' = {cfg.aggregator!r}: allowed values are "
                      f"{', '.join(robust.AGGREGATORS)}")


def _check_kept_noise(cfg: Config, raw: dict[str, Any]) -> None:
  """The noise on the kept coordinates (TopkSDP-FL): its delta, who may draw it, and
  what its calibration itself refuses (KeptNoise.check)."""
  kept = flat.kept_noise_of(cfg)
  if kept is None:
    if cfg.kept_noise_draw != "auto":   # it would be ignored: no stage draws kept noise
      raise ConfigError(f"config key 'kept_noise_draw' = {cfg.kept_noise_draw!r} with "
                        "kept_noise 'none': there is no kept noise to draw; leave it 'auto'")
    return
  if cfg.ldp_delta >= 1 / cfg.num_clients:
    raise ConfigError(f"config key 'ldp_delta' = {raw.get('ldp_delta', cfg.ldp_delta)!r} with "
                      f"kept_noise {kept.name!r}: must be < 1 / num_clients = "
                      f"{1 / cfg.num_clients:.4g} (a delta that large allows publishing a "
                      "client's data outright)")
  if cfg.kept_noise_draw == "aggregate" and cfg.server_clip_l2 is not None:
    raise ConfigError(f"config key 'kept_noise_draw' = 'aggregate' with server_clip_l2 "
                      f"{cfg.server_clip_l2:g}: the server clips each upload, so the noise "
                      "must be drawn per client (use 'client' or 'auto')")
  if cfg.kept_noise_draw == "aggregate" and cfg.byzantine_fraction > 0:
    raise ConfigError(f"config key 'kept_noise_draw' = 'aggregate' with aggregator "
                      f"{cfg.aggregator!r}, byzantine_fraction {cfg.byzantine_fraction:g}: only "
                      "honest uploads under the weighted mean have the aggregate's noise in "
                      "closed form (use 'client' or 'auto')")
  if kept.papers_chain and cfg.ldp_epsilon is None:
    raise ConfigError(f"config key 'kept_noise' = {kept.name!r}: needs ldp_epsilon (the "
                      "per-round client budget of the paper's calibration)")
  settings = flat.kept_noise_settings(cfg, kept)
  try:
    kept.numbers(settings, 1.0)
  except KeyError as e:
    raise ConfigError(f"kept_noise {kept.name!r}: its numbers() read setting {e}, which is not "
                      f"of its reads {kept.reads}") from None
  problem = kept.check(settings) if kept.check is not None else None
  if problem:
    raise ConfigError(problem)
  # (the std's dependence on the client's size and the learning rate is checked once
  # the clients' sizes are known: experiment/setup.check_kept_noise)


def _check_mechanism(cfg: Config, raw: dict[str, Any]) -> None:
  """The mechanism's delta and accountant."""
  mechanism = mechanisms.get_mechanism(cfg.dp)
  if not mechanism.private:
    return
  # delta >= 1/N allows a mechanism that publishes a random client's data outright, and
  # the (eps, delta) conversion then reports epsilon 0 (N = 20, delta 0.3 gave 0.0)
  if cfg.delta >= 1 / cfg.num_clients:
    raise ConfigError(f"config key 'delta' = {raw.get('delta', cfg.delta)!r} with dp "
                      f"{cfg.dp!r}: must be < 1 / num_clients = {1 / cfg.num_clients:.4g} (a "
                      "delta that large allows publishing a client's data outright)")
  if cfg.accountant not in mechanism.accountants:
    raise ConfigError(f"config key 'accountant' = {cfg.accountant!r} with dp {cfg.dp!r}: "
                      f"allowed values are {', '.join(mechanism.accountants)}")
  if cfg.accountant != "pld":
    return
  if mechanism.noises_sum and cfg.sampling == "fixed" and not mechanism.charged_once:
    raise ConfigError("config key 'accountant' = 'pld': dp-accounting's PLD has no "
                      "fixed-size (without replacement) sampling; use accountant 'rdp' or "
                      "sampling 'poisson'")
  if cfg.noise_multiplier is not None:
    local = mechanism.per_client_ledgers   # one participation, replace one: z / 2
    z_pld = cfg.noise_multiplier / (2 if local else 1)
    if 0 < z_pld < PLD_MIN_NOISE_MULTIPLIER:
      raise ConfigError(f"config key 'noise_multiplier' = {cfg.noise_multiplier:g} with "
                        f"accountant 'pld': PLD needs a multiplier >= {PLD_MIN_NOISE_MULTIPLIER:g}"
                        f"{' (z / 2 under local DP)' if local else ''}; use accountant 'rdp'")


def _check_participation(cfg: Config) -> None:
  """The sampling's participation schema (placement/participation.py), then a
  mechanism against it."""
  try:
    schema = privacy_setup.participation_of(cfg)
  except ValueError as e:
    key = "min_separation" if cfg.min_separation is not None else "sampling"
    raise ConfigError(f"config key {key!r} = {getattr(cfg, key)!r}: {e}") from None
  mechanism = mechanisms.get_mechanism(cfg.dp)
  # (even at min_separation 1, where the law is Poisson's: the rate, the published cohort
  # sizes and the reports read 'poisson')
  if mechanism.needs_random_cohorts and cfg.sampling not in ("fixed", "poisson"):
    raise ConfigError(f"config key 'sampling' = {cfg.sampling!r} with dp {cfg.dp!r}: its "
                      "accountant amplifies by a cohort drawn at random from all clients each "
                      "round, which a separated schedule does not give; use dp 'bandmf' "
                      "(mf_bands 1 is independent noise; sampling 'cyclic_poisson' is "
                      "amplified) or sampling 'poisson' or 'fixed'")
  if cfg.sampling not in ("fixed", "poisson") and flat.kept_noise_of(cfg) is not None:
    raise ConfigError(f"config key 'sampling' = {cfg.sampling!r} with kept_noise "
                      f"{cfg.kept_noise!r}: its report's chain amplifies by sampling and "
                      "shuffling a cohort drawn at random from all clients, which a separated "
                      "schedule does not give; use sampling 'poisson' or 'fixed'")
  if mechanism.strategy_for is None:
    return
  for key, ok, why in (("clip_parts", ("flat", "per_layer"), "the tiers' noise scales would be "
                        "ignored by the strategy's isotropic noise"),
                       ("noise_schedule", "static", "a schedule would scale each round's "
                        "decoded noise, which is no longer the matrix mechanism its "
                        "accountant charges")):
    value = getattr(cfg, key)
    if value != ok and not (isinstance(ok, tuple) and value in ok):
      raise ConfigError(f"config key {key!r} = {value!r} with dp {cfg.dp!r}: {why}")
  if cfg.mf_bands is not None and cfg.mf_bands > min(schema.min_sep, cfg.rounds):
    raise ConfigError(
        f"config key 'mf_bands' = {cfg.mf_bands} with dp {cfg.dp!r}: at most the rounds "
        f"({cfg.rounds}) and the sampler's separation of a client's rounds, min_sep = "
        f"{schema.min_sep} (sampling {cfg.sampling!r}; 'cyclic' separates them by "
        "num_clients / clients_per_round)")


def _check_attack_placement(cfg: Config) -> None:
  """An attack against the mechanism's trust boundary (privacy/boundary.py): one that
  would pass around the clip the guarantee rests on is refused."""
  mechanism = mechanisms.get_mechanism(cfg.dp)
  if cfg.byzantine_fraction == 0 or not mechanism.private:
    return
  why = boundary.problem(mechanism.boundary,
                         attacks.placement(cfg.byzantine_attack))
  if why:
    raise ConfigError(f"config key 'byzantine_attack' = {cfg.byzantine_attack!r} with dp "
                      f"{cfg.dp!r}: {why}")


def _check_stages(cfg: Config):
  """The algorithm, then which stages combine (the recipe's validate) and the rule's
  own keys; returns the recipe."""
  try:
    parse_algorithm(cfg.algorithm)
  except ValueError as e:
    raise ConfigError(f"config key 'algorithm' = {cfg.algorithm!r}: {str(e).split(': ', 1)[1]}")
  recipe = flat.from_config(cfg).validate()
  # the rule's numbers against the cohort (Krum's f and m)
  problem = recipe.rule.check(recipe.rule.hparams, cfg.clients_per_round)
  if problem:
    raise ConfigError(problem)
  return recipe


def _check_client_state_store(cfg: Config) -> None:
  """What a host table cannot do yet is refused rather than done wrong (its own keys,
  read only off the device, are in _SETUP_KEYS_READ)."""
  store = cfg.client_state_store
  if store == "device":
    return
  if "solo" in parse_algorithm(cfg.algorithm)[0]:
    raise ConfigError(f"config key 'client_state_store' = {store!r} with algorithm "
                      f"{cfg.algorithm!r}: SOLO's evaluation reads every client's model at "
                      "once; use client_state_store 'device'")


def unread_keys(cfg: Config, recipe=None) -> frozenset[str]:
  """The config keys nothing of this run reads, whatever their values: recipe keys no
  stage stands for (recipes.flat.unread_keys_of; `recipe`: cfg's, if already read),
  and set-up keys another key turns off (_SETUP_KEYS_READ)."""
  return flat.unread_keys_of(recipe or flat.from_config(cfg)) | frozenset(
      k for k, (is_read, _) in _SETUP_KEYS_READ.items() if not is_read(cfg))


def _check_unread(cfg: Config, raw: dict[str, Any], recipe) -> None:
  """A key set away from its default that nothing reads would be silently ignored
  (`noise_multiplier` without `dp` trained with no privacy and exited 0): one line
  naming the key and the setting that would make it read."""
  defaults = Config()
  for key in sorted(unread_keys(cfg, recipe)):
    value = getattr(cfg, key)
    if key in raw and value != getattr(defaults, key):
      raise ConfigError(f"config key '{key}' = {raw[key]!r} is read by nothing in this run: "
                        f"{_what_reads(key)}")


def _what_reads(key: str) -> str:
  """The setting that makes `key` read (for the message of an unread key)."""
  condition = read_condition(key)
  if condition is None:
    return "leave it at its default"
  if condition.startswith("dp "):
    condition += " (without dp the run has no privacy)"
  return f"it is read with {condition}"


def read_condition(key: str) -> str | None:
  """The setting under which `key` is read ("dp 'central' or 'local' ..."), or None
  for a key every run reads (a switch such as `dp` is always read)."""
  if key in _SWITCHES:
    return None
  if key in _SETUP_KEYS_READ:
    return _SETUP_KEYS_READ[key][1]
  terms = [n for n in TERMS if key in flat.stage_keys("term", n)]
  if terms:
    return f"algorithm {' or '.join(repr(t) for t in terms)}"
  rules = [n for n in robust.AGGREGATORS if key in flat.stage_keys("aggregator", n)]
  if rules:
    return f"aggregator {' or '.join(repr(r) for r in rules)}"
  if key in flat.MECHANISM_KEYS or key in flat.PLANNER_KEYS:
    return "dp 'central' or 'local'"
  if key in flat.ADAPTIVE_KEYS:
    return "adaptive_clipping true"
  if key in flat.KEPT_NOISE_KEYS:
    names = [n for n, k in mechanisms.KEPT_NOISE.items()
             if key in k.reads or key in kept_noise.STAGE_KEYS]
    return "kept_noise " + " or ".join(repr(n) for n in names)
  if key in flat.stage_keys("upload", "topk"):
    return "s_local > 0 (top-k uploads)"
  return None


# switches: at its default no stage stands for such a key (unread_keys lists it), and
# any other value adds the stage that reads it, so it is never refused as unread
_SWITCHES = frozenset({"dp", "adaptive_clipping", "kept_noise", "s_local", "s_global", "shuffle",
                       "coordinate_clip", "update_clip_l2", "client_budgets"})


_DP_ON = "under dp 'central' or 'local'"

# keys read only under another key's setting (set-up keys, and a mechanism's keys that
# only some of its variants read): key -> (is it read?, what makes it read)
_SETUP_KEYS_READ = {
    **{k: (lambda c: _private(c) and c.clip_parts == "tiers", f"clip_parts 'tiers' {_DP_ON}")
       for k in ("rest_tier", "tier_noise_multipliers")},
    **{k: (lambda c: _private(c) and c.tier_source == "analyzer",
           f"tier_source 'analyzer' {_DP_ON}") for k in ("analyzer_rule", "analyzer_steps")},
    **{k: (lambda c: _private(c) and c.noise_schedule != "static",
           f"noise_schedule 'convergence' or 'weighted' {_DP_ON}")
       for k in ("convergence_measure", "convergence_lambda", "convergence_window", "noise_ema")},
    "convergence_beta": (lambda c: _private(c) and c.noise_schedule == "convergence",
                         f"noise_schedule 'convergence' {_DP_ON}"),
    "mf_bands": (lambda c: "mf_bands" in mechanisms.get_mechanism(c.dp).reads, "dp 'bandmf'"),
    "local_noise_draw": (lambda c: mechanisms.get_mechanism(c.dp).report_noise is not None,
                         "dp 'local'"),
    "test_clients": (lambda c: c.partition == "natural_id", "partition 'natural_id'"),
    "hidden": (lambda c: reads_hidden(c.model), "model 'mlp', 'cnn'"),
    "lr_min": (lambda c: c.lr_schedule == "cosine", "lr_schedule 'cosine'"),
    "server_lr_min": (lambda c: c.server_lr_schedule == "cosine",
                      "server_lr_schedule 'cosine'"),
    "alpha": (lambda c: c.partition in ("dirichlet", "dirichlet_client", "flwr_dirichlet",
                                        "inner_dirichlet"),
              "partition 'dirichlet' or 'dirichlet_client', or Flower's 'flwr_dirichlet' or "
              "'inner_dirichlet'"),
    "classes_per_client": (lambda c: c.partition in ("shards", "pathological"),
                           "partition 'shards' or 'pathological'"),
    "quantity_alpha": (lambda c: c.partition == "quantity", "partition 'quantity'"),
    **{k: (lambda c: c.partition == "flwr_dirichlet", "partition 'flwr_dirichlet'")
       for k in ("min_partition_size", "self_balancing")},
    "client_sizes": (lambda c: c.partition == "inner_dirichlet", "partition 'inner_dirichlet'"),
    "class_assignment": (lambda c: c.partition == "pathological", "partition 'pathological'"),
    **{k: (lambda c: c.partition == "shard", "partition 'shard'")
       for k in ("shards_per_client", "shard_size")},
    "keep_incomplete_shard": (lambda c: c.partition == "shard" and (
        c.shards_per_client is None or c.shard_size is None), "partition 'shard' without both "
        "shards_per_client and shard_size"),
    "byzantine_attack": (lambda c: c.byzantine_fraction > 0, "byzantine_fraction > 0"),
    "byzantine_scale": (lambda c: c.byzantine_fraction > 0 and c.byzantine_attack not in (
        "alie", "label_flip", "targeted"), "byzantine_fraction > 0 and byzantine_attack "
        "'sign_flip', 'scaled', 'gaussian', 'ipm' or 'backdoor'"),
    "audit_canaries": (lambda c: _private(c), "dp 'central' or 'local' (an audit checks "
                       "a guarantee)"),
    "audit_canary_scale": (lambda c: c.audit_canaries > 0, "audit_canaries > 0"),
    "byzantine_draw": (lambda c: c.byzantine_fraction > 0, "byzantine_fraction > 0"),
    "attack_source_class": (lambda c: c.byzantine_fraction > 0 and
                            c.byzantine_attack == "targeted",
                            "byzantine_fraction > 0 and byzantine_attack 'targeted'"),
    "attack_target_class": (lambda c: c.byzantine_fraction > 0 and
                            c.byzantine_attack in ("targeted", "backdoor"),
                            "byzantine_fraction > 0 and byzantine_attack 'targeted' or "
                            "'backdoor'"),
    "backdoor_fraction": (lambda c: c.byzantine_fraction > 0 and c.byzantine_attack == "backdoor",
                          "byzantine_fraction > 0 and byzantine_attack 'backdoor'"),
    "synthetic_examples": (lambda c: c.dataset == "synthetic", "dataset 'synthetic'"),
    "synthetic_features": (lambda c: c.dataset == "synthetic", "dataset 'synthetic'"),
    "synthetic_classes": (lambda c: c.dataset == "synthetic", "dataset 'synthetic'"),
    "healthcare_examples": (lambda c: c.dataset == "healthcare", "dataset 'healthcare'"),
    "healthcare_generator": (lambda c: c.dataset == "healthcare", "dataset 'healthcare'"),
    "csv_path": (lambda c: c.dataset == "csv", "dataset 'csv'"),
    "label_column": (lambda c: c.dataset == "csv", "dataset 'csv'"),
    "tier_map_path": (lambda c: c.dataset in ("csv", "breast_cancer"),
                      "dataset 'csv' or 'breast_cancer'"),
    "max_cohort": (lambda c: c.sampling in RANDOM_COHORTS,
                   f"sampling {', '.join(map(repr, RANDOM_COHORTS))}"),
    "min_separation": (lambda c: c.sampling in TAKES_SEPARATION,
                       f"sampling {' or '.join(map(repr, TAKES_SEPARATION))}"),
    "client_state_dtype": (lambda c: c.client_state_store in ("host", "disk"),
                           "client_state_store 'host' or 'disk'"),
    "client_state_dir": (lambda c: c.client_state_store == "disk", "client_state_store 'disk'"),
    "feature_scaling": (lambda c: c.dataset in TABULAR,
                        "a tabular dataset (docs: Datasets)"),
    "server_momentum": (lambda c: flat.server_optimizer_name(c) == "momentum",
                        "server_optimizer 'momentum' or algorithm 'fedavgm'"),
    **{k: (lambda c: flat.server_optimizer_name(c) == "adam",
           "server_optimizer 'adam' or algorithm 'fedadam'")
       for k in ("server_beta1", "server_beta2", "server_eps")},
}


def _check_data(cfg: Config) -> None:
  if cfg.feature_scaling != "auto" and cfg.dataset == "custom":
    raise ConfigError(f"config key 'feature_scaling' = {cfg.feature_scaling!r} with dataset "
                      "'custom': your own data is used as given; scale it before "
                      "data.from_arrays (e.g. with data.scale_features) and leave it 'auto'")
  if cfg.feature_scaling != "auto" and cfg.dataset not in TABULAR:
    raise ConfigError(f"config key 'feature_scaling' = {cfg.feature_scaling!r} with dataset "
                      f"{cfg.dataset!r}: images are scaled to [0, 1] by a fixed rule; only "
                      f"{', '.join(TABULAR)} are standardised (leave it 'auto')")
  if cfg.dataset == "csv" and not cfg.csv_path:
    raise ConfigError("config key 'csv_path' is required when dataset = 'csv'")
