"""Numeric hyperparameters as data: the pytree of arrays a compiled round reads.

The compiled round (core/round.make_round) takes its numbers from a flat dict of
float32 arrays rather than from Python constants baked in at trace time, so a
new learning rate, clip norm or noise multiplier runs the same compiled program
(no recompilation), and a batch of such dicts can be `vmap`ped over. What stays
static is structure: which stages run, shapes, cohort sizes, the sparsity k,
the clip layout's parts, whether a schedule or momentum is on at all.

Users change hyperparameters through the config's keys (`Simulation.hparams_for`):
derived entries (the RDP of one round at the new noise, a budget's limit) are
recomputed on the host from the same functions the config path uses, so the
accountant always charges the noise the round applies.

Entries (all float32; `[orders]`: accounting.DEFAULT_ORDERS):

  lr, lr_alpha, lr_span     client learning rate; cosine: lr (span c_t + alpha),
                            c_t = (1 + cos(pi t / rounds)) / 2, alpha = lr_min / lr,
                            span = 1 - alpha (each rounded once from float64)
  momentum                  client heavy-ball momentum (its presence is static)
  server_lr, server_momentum
  clip_norm                 the clip norm a run starts from
  tier_scales [parts]       the clip parts' static noise multipliers (tiers; else ones)
  update_noise              std of the update noise over the clip norm (z_u)
  count_stddev              std of adaptive clipping's count noise
  target_quantile, clip_lr  adaptive clipping (Andrew et al. 2021)
  event_rdp [orders]        RDP of one round (central) or participation (local),
                            float32 rounded up
  event_table [G, orders]   central DP with a noise schedule: the round's RDP at
                            the controller's grid outputs
  budget_limit              central DP: the epsilon a round may not pass
  client_budget_limits [N]  local DP with budgets: each client's limit
  delta
  terms {term: {key: v}}    the local terms' numbers (algorithms/*.py hparams)
  aggregator {key: v}       the aggregation rule's numbers (robust/*.py hparams);
                            counts (Krum's f and m, iterations) are int32
  convergence_beta, convergence_lambda, noise_ema, noise_ema_rest (1 - noise_ema)
  paper_epsilon_scale       sqrt(2 ln(1.25 / delta)): the dynamic-DP paper's charge
                            of a round is this over its base noise multiplier
  audit_canary_scale        the canaries' upload norm over clip_norm (audits only)
"""

from __future__ import annotations

import math

import numpy as np

from fedjax_dp.algorithms import parse_algorithm
from fedjax_dp.config.keys import KEYS
from fedjax_dp.config.plugin_keys import PLUGIN_KEYS
from fedjax_dp.errors import ConfigError
from fedjax_dp.privacy import accounting, mechanisms
from fedjax_dp.recipes import flat
from fedjax_dp.recipes.flat import from_config, server_optimizer_name


class StructureChange(ConfigError):
  """A change the compiled round cannot take as data: a new simulation is needed
  (a sweep runs such a cell as a program of its own)."""


# Config keys whose values are data: changing one of them (hparams_for) reuses
# the compiled round. Everything else in the config is structure.
NUMERIC_KEYS = tuple(k.name for k in KEYS if k.data) + tuple(
    # the local terms' and the aggregation rules' numbers: each key that feeds a
    # constructor argument with a number (its row in config/keys.py); a string fed
    # (contrastive's form, FedADMM's upload) is structure
    k.name for k in KEYS if type(k.default) in (int, float)
    and any(f.startswith(("term:", "aggregator:")) for f in k.feeds))


def numeric_keys() -> tuple[str, ...]:
  """NUMERIC_KEYS and the numeric keys plugins registered (config/plugin_keys.py):
  each feeds a stage argument, which the round reads as data where the stage keeps
  it in its hparams (with_hparams refuses one it does not)."""
  return NUMERIC_KEYS + tuple(k.name for k in PLUGIN_KEYS.values()
                              if type(k.default) in (int, float))


# keys after which central DP's calibration to target_epsilon is done again
RECALIBRATING = frozenset({"target_epsilon", "delta", "noise_multiplier"})


def _f32(v) -> np.ndarray:
  """One rounding from the float64 value, as a Python constant in the trace had."""
  return np.asarray(v, np.float64).astype(np.float32)


def budget_limit(target_epsilon):
  """The epsilon a budget check compares against: the target less 1e-5 relative,
  so float32 rounding inside the round can never let a ledger pass the target."""
  return target_epsilon * (1 - 1e-5)


def round_hparams(cfg, privacy, recipe=None) -> dict[str, np.ndarray]:
  """The compiled round's hyperparameters from the config, its resolved `privacy`
  (privacy/setup.Privacy) and its `recipe` (the stages' numbers; None: read from
  cfg): host numpy float32, placed by the caller."""
  # only what the round reads: an entry it never reads would let a sweep over it
  # run identical replicas (with_hparams refuses such a key)
  hp = {"lr": _f32(cfg.lr), "server_lr": _f32(cfg.server_lr), "clip_norm": _f32(cfg.clip_norm)}
  if cfg.lr_schedule == "cosine":
    alpha = cfg.lr_min / cfg.lr
    hp.update(lr_alpha=_f32(alpha), lr_span=_f32(1 - alpha))
  if cfg.server_lr_schedule == "cosine":
    hp["server_lr_alpha"] = _f32(cfg.server_lr_min / cfg.server_lr)
  if cfg.momentum > 0:
    hp["momentum"] = _f32(cfg.momentum)
  if server_optimizer_name(cfg) == "momentum":
    hp["server_momentum"] = _f32(cfg.server_momentum)
  if recipe is None:
    recipe = from_config(cfg)
  hp.update(_term_and_rule_hparams(recipe))
  hp["pipeline"] = _pipeline_hparams(recipe)
  if cfg.audit_canaries > 0:
    hp["audit_canary_scale"] = _f32(cfg.audit_canary_scale)
  mechanism = mechanisms.get_mechanism(privacy.mode)
  if not mechanism.private:
    return hp
  hp.update(tier_scales=_f32(privacy.tier_scales()),
            update_noise=_f32(privacy.update_noise_multiplier), delta=_f32(cfg.delta),
            event_rdp=accounting.event_to_float32(privacy.event_rdp),
            paper_epsilon_scale=_f32(math.sqrt(2.0 * math.log(1.25 / cfg.delta))))
  if privacy.adaptive:
    hp.update(count_stddev=_f32(privacy.count_stddev), target_quantile=_f32(cfg.target_quantile),
              clip_lr=_f32(cfg.clip_lr))
  if privacy.schedule != "static":
    hp.update(convergence_beta=_f32(cfg.convergence_beta),
              convergence_lambda=_f32(cfg.convergence_lambda), noise_ema=_f32(cfg.noise_ema),
              noise_ema_rest=_f32(1.0 - cfg.noise_ema))
  if privacy.event_table is not None:
    hp["event_table"] = np.asarray(privacy.event_table, np.float32)
  if privacy.target_epsilon is not None:
    hp["budget_limit"] = _f32(budget_limit(privacy.target_epsilon))
    if mechanism.per_client_ledgers:
      # as the round computed them: one target rounded once, or float32 budgets
      # times the float32 factor
      hp["client_budget_limits"] = (
          np.full(cfg.num_clients, hp["budget_limit"]) if privacy.client_budgets is None
          else np.asarray(privacy.client_budgets, np.float32) * np.float32(1 - 1e-5))
  return hp


def _as_array(v) -> np.ndarray:
  """int32 for counts (Krum's f and m, iteration counts), float32 otherwise."""
  if isinstance(v, (bool, np.bool_)):
    raise TypeError(f"a boolean hyperparameter {v!r} is structure, not data")
  return np.int32(v) if isinstance(v, (int, np.integer)) else _f32(v)


def _term_and_rule_hparams(recipe) -> dict:
  """{'terms': {term: {key: array}}, 'aggregator': {key: array}}: the local terms'
  and the aggregation rule's numbers (algorithms/, robust/), each stage's hparams."""
  return {"terms": {c.stage.name: {k: _as_array(v) for k, v in c.stage.hparams.items()}
                    for c in recipe.terms},
          "aggregator": {k: _as_array(v) for k, v in recipe.rule_hparams().items()}}


def _pipeline_hparams(recipe) -> tuple:
  """The upload stages' numbers, one dict per stage in the chain's order
  (pipeline.ClientStage.hparams): clip bounds, the kept noise's std."""
  chain = recipe.client_pipeline()
  if chain is None:
    return ()
  return tuple({k: _as_array(v) for k, v in stage.items()} for stage in chain.hparams)


def check_same_structure(cfg, new) -> None:
  """Raises StructureChange where changing numeric keys from `cfg` to `new` would
  change the compiled round's structure (a new simulation is needed)."""
  changes = {
      "momentum": (cfg.momentum > 0) != (new.momentum > 0)
                  or ("scaffold" in parse_algorithm(cfg.algorithm)[0]
                      and cfg.momentum != new.momentum),
      "noise_multiplier": (cfg.noise_multiplier is None) != (new.noise_multiplier is None),
      "target_epsilon": (cfg.target_epsilon is None) != (new.target_epsilon is None),
      **{key: (getattr(cfg, key) is None) != (getattr(new, key) is None)
         for key in ("coordinate_clip", "update_clip_l2", "final_clip_l2")},
  }
  bad = [k for k, changed in changes.items() if changed]
  if bad:
    raise StructureChange(f"with_hparams: {bad[0]} {getattr(cfg, bad[0])!r} -> "
                      f"{getattr(new, bad[0])!r} changes the compiled round's structure "
                      "(momentum on or off, SCAFFOLD's step count, a noise multiplier, "
                      "target or upload clip set or unset); build a new simulation")


def check_numbers_are_data(cfg, new) -> None:
  """Raises StructureChange where a plugin's key changed its stage other than in the
  stage's hparams: a constructor that bakes the number into new functions (a closure
  over it) or keeps it as structure. The compiled round would keep the old number,
  so the change needs a program of its own (a sweep then runs one)."""
  changed = [k for k in PLUGIN_KEYS if getattr(cfg, k) != getattr(new, k)]
  if not changed:
    return
  before, after = from_config(cfg), from_config(new)
  stages = lambda r: [c.stage for c in r.terms] + [r.rule]
  for a, b in zip(stages(before), stages(after)):
    if a._replace(hparams=None) != b._replace(hparams=None):
      raise StructureChange(
          f"with_hparams: {', '.join(changed)} changes {a.name!r} other than in its hparams "
          "(its constructor makes new functions or keeps the number as structure: build "
          "them once, at module level, and read the number from hp); a new simulation is "
          "needed")


def digest(hp: dict) -> str:
  """SHA-256 of the pytree's keys, dtypes and values (host copies)."""
  import hashlib
  import jax
  h = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_leaves_with_path(hp):
    a = np.asarray(leaf)
    h.update(f"{jax.tree_util.keystr(path)}:{a.dtype}:{a.shape}".encode())
    h.update(a.tobytes())
  return h.hexdigest()


def same(a: dict, b: dict) -> bool:
  return digest(a) == digest(b)


def check_overridable(cfg, overrides: dict, calibrated, client_budgets: bool) -> None:
  """Raises StructureChange for overrides the host could not account as the round
  applies them: a new target or delta against per-client budgets (they were
  allocated for the old target), against a resumed run's calibration (which
  counted the rounds already spent), and a new learning rate under kept_noise
  'paper' (its noise follows the lr, and a report of a run mixing two lrs needs
  the run's privacy log)."""
  keys = set(overrides)
  problems = []
  if client_budgets and keys & RECALIBRATING:
    problems.append("per-client budgets were allocated for the configured target, noise "
                    "and delta")
  if calibrated is not None and keys & RECALIBRATING:
    problems.append("this simulation resumes a run calibrated to what was left of its target")
  kept = flat.kept_noise_of(cfg)
  if kept is not None and kept.follows_lr and keys & {"lr", "lr_min"}:
    problems.append(f"kept_noise {kept.name!r} calibrates its noise to the learning rate")
  if problems:
    raise StructureChange(f"with_hparams: {', '.join(sorted(keys))} cannot change here: "
                      f"{problems[0]}; build a new simulation")
