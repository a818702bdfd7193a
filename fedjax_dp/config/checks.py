"""The checks a Config passes before anything runs: each key on its own (a choice,
a range), the keys against the population and its sampling, the stages and their
combination (the recipe's validate), and the data. Each raises ConfigError with
one line naming the key, the value as the user wrote it and what is allowed.
"""

from __future__ import annotations

from typing import Any

from fedjax_dp.config.schema import CHOICES, FLOAT32_MAX, MIN_NOISE_MULTIPLIER, RANGES, Config
from fedjax_dp.errors import ConfigError


def _describe_range(key: str) -> str:
  lo, hi, lo_inc, hi_inc = RANGES[key]
  show = lambda v: str(v) if isinstance(v, int) else f"{v:g}"   # 2147483647, not 2.14748e+09
  parts = []
  if lo is not None:
    parts.append(f"{'>=' if lo_inc else '>'} {show(lo)}")
  if hi is not None:
    parts.append(f"{'<=' if hi_inc else '<'} {show(hi)}")
  return " and ".join(parts)


def _check(cfg: Config, raw: dict[str, Any], refuse_unread: bool = True) -> None:
  """Raises ConfigError for the first bad value, shown as the user wrote it (`raw`):
  each key's own values, the set-up's (population, sampling, Byzantine clients),
  then the run's recipe (recipes.from_config(cfg).validate(): which stages combine,
  from their properties), then the data's; then a key of `raw` set away from its
  default that nothing of this run reads (unless not `refuse_unread`: a saved run's
  config, accepted when it was written)."""
  _check_keys(cfg, raw)
  _check_population(cfg, raw)
  recipe = _check_stages(cfg)
  _check_client_state_store(cfg)
  _check_data(cfg)
  if refuse_unread:
    _check_unread(cfg, raw, recipe)


def unread_keys(cfg: Config, recipe=None) -> frozenset[str]:
  """The config keys nothing of this run reads, whatever their values: recipe keys no
  stage stands for (recipes.flat.unread_keys_of; `recipe`: cfg's, if already read),
  and set-up keys another key turns off (_SETUP_KEYS_READ)."""
  from fedjax_dp.recipes import flat
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
  from fedjax_dp import robust
  from fedjax_dp.algorithms.registry import TERMS
  from fedjax_dp.recipes import flat
  if key in _SWITCHES:
    return None
  if key in _SETUP_KEYS_READ:
    return _SETUP_KEYS_READ[key][1]
  terms = [n for n, t in TERMS.items() if key in t.keys]
  if terms:
    return f"algorithm {' or '.join(repr(t) for t in terms)}"
  rules = [n for n, a in robust.AGGREGATORS.items() if key in a.keys]
  if rules:
    return f"aggregator {' or '.join(repr(r) for r in rules)}"
  if key in flat.MECHANISM_KEYS or key in flat.PLANNER_KEYS:
    return "dp 'central' or 'local'"
  if key in flat.ADAPTIVE_KEYS:
    return "adaptive_clipping true"
  if key in flat.UPLOAD_KEYS["gaussian_on_kept"]:
    return "kept_noise 'paper' or 'multiplier'"
  if key in flat.UPLOAD_KEYS["topk"]:
    return "s_local > 0 (top-k uploads)"
  return None


# switches: at its default no stage stands for such a key (unread_keys lists it), and
# any other value adds the stage that reads it, so it is never refused as unread
_SWITCHES = frozenset({"dp", "adaptive_clipping", "kept_noise", "s_local", "s_global", "shuffle",
                       "coordinate_clip", "update_clip_l2", "client_budgets", "cluster_noise"})


def _server_optimizer(cfg: Config) -> str:
  from fedjax_dp.training.server import server_optimizer_name
  return server_optimizer_name(cfg)


def _tabular() -> tuple[str, ...]:
  from fedjax_dp.data import TABULAR
  return TABULAR


_DP_ON = "under dp 'central' or 'local'"

# keys read only under another key's setting (set-up keys, and a mechanism's keys that
# only some of its variants read): key -> (is it read?, what makes it read)
_SETUP_KEYS_READ = {
    **{k: (lambda c: c.dp != "none" and c.clip_parts == "tiers", f"clip_parts 'tiers' {_DP_ON}")
       for k in ("rest_tier", "tier_noise_multipliers")},
    **{k: (lambda c: c.dp != "none" and c.tier_source == "analyzer",
           f"tier_source 'analyzer' {_DP_ON}") for k in ("analyzer_rule", "analyzer_steps")},
    **{k: (lambda c: c.dp != "none" and c.noise_schedule != "static",
           f"noise_schedule 'convergence' or 'weighted' {_DP_ON}")
       for k in ("convergence_measure", "convergence_lambda", "convergence_window", "noise_ema")},
    "convergence_beta": (lambda c: c.dp != "none" and c.noise_schedule == "convergence",
                         f"noise_schedule 'convergence' {_DP_ON}"),
    "lr_min": (lambda c: c.lr_schedule == "cosine", "lr_schedule 'cosine'"),
    "alpha": (lambda c: c.partition in ("dirichlet", "dirichlet_client"),
              "partition 'dirichlet' or 'dirichlet_client'"),
    "classes_per_client": (lambda c: c.partition == "shards", "partition 'shards'"),
    "quantity_alpha": (lambda c: c.partition == "quantity", "partition 'quantity'"),
    "byzantine_attack": (lambda c: c.byzantine_fraction > 0, "byzantine_fraction > 0"),
    "byzantine_scale": (lambda c: c.byzantine_fraction > 0 and c.byzantine_attack not in (
        "alie", "label_flip", "targeted"), "byzantine_fraction > 0 and byzantine_attack "
        "'sign_flip', 'scaled', 'gaussian', 'ipm' or 'backdoor'"),
    "audit_canaries": (lambda c: c.dp != "none", "dp 'central' or 'local' (an audit checks "
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
    "max_cohort": (lambda c: c.sampling == "poisson", "sampling 'poisson'"),
    "client_state_dtype": (lambda c: c.client_state_store in ("host", "disk"),
                           "client_state_store 'host' or 'disk'"),
    "client_state_dir": (lambda c: c.client_state_store == "disk", "client_state_store 'disk'"),
    "feature_scaling": (lambda c: c.dataset in _tabular(),
                        "a tabular dataset (see Datasets)"),
    "server_momentum": (lambda c: _server_optimizer(c) == "momentum",
                        "server_optimizer 'momentum' or algorithm 'fedavgm'"),
    **{k: (lambda c: _server_optimizer(c) == "adam",
           "server_optimizer 'adam' or algorithm 'fedadam'")
       for k in ("server_beta1", "server_beta2", "server_eps")},
}


def _check_client_state_store(cfg: Config) -> None:
  """What a host table cannot do yet is refused rather than done wrong (its own keys,
  read only off the device, are in _SETUP_KEYS_READ)."""
  store = cfg.client_state_store
  if store == "device":
    return
  from fedjax_dp.algorithms import parse_algorithm
  if "solo" in parse_algorithm(cfg.algorithm)[0]:
    raise ConfigError(f"config key 'client_state_store' = {store!r} with algorithm "
                      f"{cfg.algorithm!r}: SOLO's evaluation reads every client's model at "
                      "once; use client_state_store 'device'")


def _check_keys(cfg: Config, raw: dict[str, Any]) -> None:
  """Each key on its own: a choice among its values, a number in its range."""
  for key, choices in CHOICES.items():
    value = getattr(cfg, key)
    if key == "aggregator":
      from fedjax_dp.robust import AGGREGATORS
      choices = tuple(AGGREGATORS)
    if value not in choices:
      raise ConfigError(
          f"config key '{key}' = {value!r}: allowed values are {', '.join(choices)}")
  for key in RANGES:
    value = getattr(cfg, key)
    if value is None:
      continue
    lo, hi, lo_inc, hi_inc = RANGES[key]
    ok = True
    if lo is not None:
      ok &= value >= lo if lo_inc else value > lo
    if hi is not None:
      ok &= value <= hi if hi_inc else value < hi
    if not ok:
      raise ConfigError(f"config key '{key}' = {raw.get(key, value)!r}: must be "
                        f"{_describe_range(key)}")
  if cfg.byzantine_scale > FLOAT32_MAX:
    raise ConfigError(f"config key 'byzantine_scale' = {cfg.byzantine_scale:g}: above float32's "
                      "largest value (3.4e38)")


def _check_population(cfg: Config, raw: dict[str, Any]) -> None:
  """Keys against the population and its sampling (num_clients, clients_per_round)."""
  def shown(key):
    return raw.get(key, getattr(cfg, key))

  if cfg.clients_per_round > cfg.num_clients:
    raise ConfigError(
        f"config key 'clients_per_round' = {cfg.clients_per_round}: must be <= num_clients "
        f"({cfg.num_clients})")
  # delta >= 1/N allows a mechanism that publishes a random client's data outright, and
  # the (eps, delta) conversion then reports epsilon 0 (N = 20, delta 0.3 gave 0.0)
  if cfg.dp != "none" and cfg.delta >= 1 / cfg.num_clients:
    raise ConfigError(f"config key 'delta' = {shown('delta')!r} with dp {cfg.dp!r}: must be < 1 / "
                      f"num_clients = {1 / cfg.num_clients:.4g} (a delta that large allows "
                      "publishing a client's data outright)")
  if cfg.kept_noise != "none" and cfg.ldp_delta >= 1 / cfg.num_clients:
    raise ConfigError(f"config key 'ldp_delta' = {shown('ldp_delta')!r} with kept_noise "
                      f"{cfg.kept_noise!r}: must be < 1 / num_clients = "
                      f"{1 / cfg.num_clients:.4g} (a delta that large allows publishing a "
                      "client's data outright)")
  if cfg.max_cohort is not None and cfg.max_cohort < cfg.clients_per_round:
    raise ConfigError(
        f"config key 'max_cohort' = {cfg.max_cohort}: must be >= clients_per_round "
        f"({cfg.clients_per_round})")
  if cfg.lr_min > cfg.lr:
    raise ConfigError(f"config key 'lr_min' = {cfg.lr_min}: must be <= lr ({cfg.lr})")
  if cfg.dp == "central" and cfg.sampling == "fixed" and cfg.accountant == "pld":
    raise ConfigError("config key 'accountant' = 'pld': dp-accounting's PLD has no "
                      "fixed-size (without replacement) sampling; use accountant 'rdp' or "
                      "sampling 'poisson'")
  if cfg.audit_canaries >= cfg.num_clients:
    raise ConfigError(f"config key 'audit_canaries' = {cfg.audit_canaries}: must be below "
                      f"num_clients ({cfg.num_clients})")
  if cfg.audit_canaries > 0 and cfg.byzantine_fraction > 0:
    raise ConfigError(f"config key 'audit_canaries' = {cfg.audit_canaries} with "
                      f"byzantine_fraction {cfg.byzantine_fraction:g}: an audit's canaries and "
                      "Byzantine clients would overlap; audit without attackers")
  if cfg.byzantine_fraction > 0 and int(cfg.byzantine_fraction * cfg.num_clients + 1e-9) == 0:
    raise ConfigError(f"config key 'byzantine_fraction' = {cfg.byzantine_fraction:g}: of "
                      f"{cfg.num_clients} clients that is no malicious client (floor of "
                      f"fraction x num_clients); at least {1 / cfg.num_clients:g}")
  if cfg.byzantine_fraction > 0 and cfg.dp != "none":
    # the attack's placement against the mechanism's trust boundary (privacy/boundary.py)
    from fedjax_dp.privacy import boundary, dp_round
    from fedjax_dp.robust import attacks
    why = boundary.problem(dp_round.MECHANISMS[cfg.dp].boundary,
                           attacks.placement(cfg.byzantine_attack))
    if why:
      raise ConfigError(f"config key 'byzantine_attack' = {cfg.byzantine_attack!r} with dp "
                        f"{cfg.dp!r}: {why}")
  if cfg.server_clip_l2 is not None and cfg.kept_noise != "none" and \
      cfg.kept_noise_draw == "aggregate":
    raise ConfigError(f"config key 'kept_noise_draw' = 'aggregate' with server_clip_l2 "
                      f"{cfg.server_clip_l2:g}: the server clips each upload, so the noise "
                      "must be drawn per client (use 'client' or 'auto')")
  if cfg.algorithm == "solo" and (cfg.server_clip_l2 is not None or cfg.audit_canaries or (
      cfg.byzantine_fraction > 0 and cfg.byzantine_attack in ("label_flip", "targeted",
                                                              "backdoor"))):
    key = ("server_clip_l2" if cfg.server_clip_l2 is not None else
           "audit_canaries" if cfg.audit_canaries else "byzantine_attack")
    raise ConfigError(f"config key {key!r} = {getattr(cfg, key)!r} with algorithm 'solo': "
                      "SOLO trains no global model, so nothing aggregates, audits or "
                      "measures it")
  if cfg.byzantine_fraction > 0 and cfg.kept_noise != "none" and \
      cfg.kept_noise_draw == "aggregate":
    raise ConfigError(f"config key 'kept_noise_draw' = 'aggregate' with aggregator "
                      f"{cfg.aggregator!r}, byzantine_fraction {cfg.byzantine_fraction:g}: only "
                      "honest uploads under the weighted mean have the aggregate's noise in "
                      "closed form (use 'client' or 'auto')")


def _check_stages(cfg: Config):
  """The stages' own numbers, then their combination (the recipe's validate);
  returns the recipe."""
  if cfg.noise_multiplier is not None and 0 < cfg.noise_multiplier < MIN_NOISE_MULTIPLIER:
    raise ConfigError(f"config key 'noise_multiplier' = {cfg.noise_multiplier:g}: must be 0 (no "
                      f"noise) or >= {MIN_NOISE_MULTIPLIER:g} (below it the accountant's "
                      "arithmetic overflows; any such run has no meaningful epsilon)")
  if cfg.accountant == "pld" and cfg.noise_multiplier is not None and cfg.dp != "none":
    from fedjax_dp.privacy.planning import PLD_MIN_NOISE_MULTIPLIER
    z_pld = cfg.noise_multiplier / (2 if cfg.dp == "local" else 1)   # local: replace-one, z / 2
    if 0 < z_pld < PLD_MIN_NOISE_MULTIPLIER:
      raise ConfigError(f"config key 'noise_multiplier' = {cfg.noise_multiplier:g} with "
                        f"accountant 'pld': PLD needs a multiplier >= {PLD_MIN_NOISE_MULTIPLIER:g}"
                        f"{' (z / 2 under local DP)' if cfg.dp == 'local' else ''}; use "
                        "accountant 'rdp'")
  if cfg.kept_noise_draw != "auto" and cfg.kept_noise == "none":
    # it would be ignored: no stage draws kept noise
    raise ConfigError(f"config key 'kept_noise_draw' = {cfg.kept_noise_draw!r} with kept_noise "
                      "'none': there is no kept noise to draw; leave it 'auto'")
  if cfg.kept_noise == "paper" and cfg.ldp_epsilon is None:
    raise ConfigError("config key 'kept_noise' = 'paper': needs ldp_epsilon (the per-round "
                      "client budget of the paper's calibration)")
  from fedjax_dp.algorithms import parse_algorithm
  try:
    parse_algorithm(cfg.algorithm)
  except ValueError as e:
    raise ConfigError(f"config key 'algorithm' = {cfg.algorithm!r}: {str(e).split(': ', 1)[1]}")
  from fedjax_dp.recipes import from_config
  recipe = from_config(cfg).validate()
  problem = recipe.rule.check(cfg)   # the rule's own keys (Krum's f and m)
  if problem:
    raise ConfigError(problem)
  return recipe


def _check_data(cfg: Config) -> None:
  from fedjax_dp.data import TABULAR
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
