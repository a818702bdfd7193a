"""Which stage combinations a recipe refuses, judged from the stages' static properties.

Each rule reads properties the stage modules declare (an aggregator's `linear`,
a mechanism's `noises_sum`, a term's `outside_dp`, a client stage's
`needs_sparsifier` / `owes_noise`, ...), never the names of the stages, so a
new stage brings its own behaviour here: a rule registered with linear=False is
refused with central DP with no line added. The config values only fill the
one-line messages, which are the config's (the CLI refuses at the same point
with the same words). Rules run in order and the first problem is reported.
"""

from __future__ import annotations

from typing import Callable

from fedjax_dp.recipes.base import Recipe


def _mechanism(r: Recipe):
  return r.privacy.stage if r.privacy is not None else None


def _algorithm_names_the_terms(r: Recipe, v: dict) -> str | None:
  from fedjax_dp.algorithms import registry
  try:
    names, _ = registry.parse_algorithm(r.algorithm)
  except ValueError as e:
    return f"config key 'algorithm' = {r.algorithm!r}: {str(e).split(': ', 1)[1]}"
  have = tuple(c.stage.name for c in r.terms)
  if tuple(sorted(names)) != tuple(sorted(have)):
    return (f"recipe {r.name!r}: algorithm {r.algorithm!r} names the terms {list(names)}, "
            f"but the recipe has {list(have)}")
  return None


def _mechanism_has_noise(r: Recipe, v: dict) -> str | None:
  m = _mechanism(r)
  if m is None or v["noise_multiplier"] is not None:
    return None
  if m.calibrates_to_target and v["target_epsilon"] is None:
    return f"dp {m.name!r} needs noise_multiplier or target_epsilon"
  if not m.calibrates_to_target:
    return (f"dp {m.name!r} needs noise_multiplier (target_epsilon, if given, caps each "
            "client's own ledger)")
  return None


def _mechanism_own_check(r: Recipe, v: dict) -> str | None:
  """What the mechanism itself refuses of the run's settings (Mechanism.check)."""
  m = _mechanism(r)
  return m.check(v) if m is not None and m.check is not None else None


def _planner(r: Recipe, v: dict) -> str | None:
  if r.planner is None:
    return None
  p, schedule = r.planner.stage, v["noise_schedule"]
  if p.needs_mechanism and r.privacy is None:
    return (f"config key 'noise_schedule' = {schedule!r} with dp 'none': adaptive noise needs "
            "dp 'local' or 'central'")
  if p.varies_noise and r.adaptive_clip is not None and \
      r.adaptive_clip.stage.excludes_varying_noise:
    return (f"config key 'noise_schedule' = {schedule!r} with adaptive_clipping: use one or "
            "the other")
  if p.needs_tiers and v["clip_parts"] != "tiers":
    return (f"config key 'noise_schedule' = {schedule!r}: the sensitivity weights are per tier "
            f"(needs clip_parts 'tiers'; clip_parts is {v['clip_parts']!r})")
  if p.varies_noise and v["accountant"] == "pld":
    return (f"config key 'accountant' = 'pld' with noise_schedule {schedule!r}: the noise "
            "changes each round; use 'rdp'")
  return None


def _budgets(r: Recipe, v: dict) -> str | None:
  if r.budgets is None:
    return None
  b, m = r.budgets.stage, _mechanism(r)
  if (b.needs_per_client_ledgers and (m is None or not m.per_client_ledgers)) or \
      (b.needs_target and v["target_epsilon"] is None):
    return (f"config key 'client_budgets' = {v['client_budgets']!r}: per-client budgets need "
            "dp 'local' and target_epsilon (the mean budget)")
  return None


def _rule_sets_client_noise(r: Recipe, v: dict) -> str | None:
  """A rule that sets each client's noise (per-cluster noise) needs a mechanism whose
  client half applies each client's factor and whose admission charges it for it: a
  mechanism that ignored the factor would be charged for noise it never drew."""
  m = _mechanism(r)
  if r.rule.client_noise is not None and (m is None or not m.scales_client_noise):
    what = (f"config key 'cluster_noise' = {v['cluster_noise']!r}: per-cluster noise"
            if v.get("cluster_noise", "uniform") != "uniform" else
            f"aggregator {r.rule.name!r} sets each client's noise; it")
    return (f"{what} needs dp 'local' (a mechanism that scales each client's noise and "
            f"charges it; dp is {v['dp']!r})")
  return None


def _adaptive_clip(r: Recipe, v: dict) -> str | None:
  m = _mechanism(r)
  if r.adaptive_clip is not None and r.adaptive_clip.stage.needs_noised_sum and \
      (m is None or not m.noises_sum):
    return f"config key 'adaptive_clipping' = true: needs dp 'central' (dp is {v['dp']!r})"
  return None


def _terms_covered(r: Recipe, v: dict) -> str | None:
  """A term whose state reaches the server unprivatized, or whose models are
  released unnoised, leaves no guarantee to report."""
  if r.privacy is not None:
    for c in r.terms:
      if c.stage.outside_dp:
        return (f"config key 'algorithm' = {r.algorithm!r} with dp {v['dp']!r}: "
                f"{c.stage.outside_dp}")
  if any(c.stage.privatizes for c in r.upload):
    for c in r.terms:
      if c.stage.outside_kept_noise:
        return (f"config key 'kept_noise' = {v['kept_noise']!r} with algorithm "
                f"{r.algorithm!r}: {c.stage.outside_kept_noise}")
  return None


def _needs_sparsifier_message(name: str, v: dict) -> str:
  return {
      "gaussian_on_kept": f"config key 'kept_noise' = {v['kept_noise']!r}: noise on the kept "
                          "coordinates needs top-k (s_local > 0)",
      "clip_sent": "config key 'final_clip_l2' clips the sent top-k update: needs s_local > 0 "
                   "(without top-k use update_clip_l2)",
      "public_update": "config key 'index_selection' = 'public_topk': needs s_local > 0",
  }.get(name, f"stage {name!r} acts on the sent coordinates: needs a top-k stage (s_local > 0)")


def _upload_order(r: Recipe, v: dict, privatizing: bool) -> str | None:
  """Stages that act on what an earlier stage did: sparsified or clipped it."""
  sparsified, bounded = False, False
  for c in r.upload:
    s = c.stage
    if s.privatizes == privatizing:
      if s.needs_sparsifier and not sparsified:
        return _needs_sparsifier_message(s.name, v)
      if s.needs_bound and not bounded:
        return (f"config key 'kept_noise' = {v['kept_noise']!r}: needs final_clip_l2, "
                "coordinate_clip or update_clip_l2 (the noise is calibrated to the clip)")
    sparsified |= s.sparsifies
    bounded |= s.bound is not None
  return None


def _noise_then_clip(r: Recipe, v: dict) -> str | None:
  return _upload_order(r, v, privatizing=True)


def _aggregate_is_a_sum(r: Recipe, v: dict) -> str | None:
  """Central noise, noise owed to the aggregate and shuffled tuples all need a
  weighted sum of the uploads."""
  if r.rule.linear:
    return None
  m = _mechanism(r)
  if m is not None and m.noises_sum:
    return (f"config key 'aggregator' = {v['aggregator']!r} with dp {v['dp']!r}: the server "
            "noise is calibrated to a sum of clipped updates, which only 'mean' computes "
            "(robust rules are post-processing under dp 'local')")
  if any(c.stage.owes_noise for c in r.upload):
    return (f"config key 'kept_noise_draw' = 'aggregate' with aggregator {v['aggregator']!r}, "
            "byzantine_fraction 0: only honest uploads under the weighted mean have the "
            "aggregate's noise in closed form (use 'client' or 'auto')")
  if r.shuffle is not None and r.shuffle.stage.needs_linear_aggregate:
    return (f"config key 'aggregator' = {v['aggregator']!r} with shuffle {v['shuffle']!r}: the "
            "robust rules are not defined on per-layer shuffled tuples; use aggregator 'mean' "
            "with the shuffler")
  return None


def _mechanism_after_pipeline(r: Recipe, v: dict) -> str | None:
  m = _mechanism(r)
  if m is None:
    return None
  if m.clips_after_pipeline and any(c.stage.owes_noise for c in r.upload):
    return (f"config key 'kept_noise_draw' = 'aggregate' with dp {v['dp']!r}: the DP clip comes "
            "after the pipeline, so the noise must be drawn per client (use 'client' or 'auto')")
  if m.noises_each_upload and any(c.stage.private_positions for c in r.upload):
    # the bytes are a sparse upload's, whose positions are the update's largest, unnoised;
    # the epsilon is a dense noised vector's
    return (f"config key 'index_selection' = {v['index_selection']!r} with dp {v['dp']!r} and "
            f"s_local {v['s_local']:g}: the top-k positions come from the private update and "
            "are sent unnoised, outside the local guarantee; use random_k or public_topk")
  return None


def _other_stage_inputs(r: Recipe, v: dict) -> str | None:
  problem = _upload_order(r, v, privatizing=False)
  if problem:
    return problem
  if not any(c.stage.sparsifies for c in r.upload):
    for c in r.server:
      if c.stage.needs_sparsifier:
        return _needs_sparsifier_message(c.stage.name, v)
  return None


RULES: tuple[Callable[[Recipe, dict], str | None], ...] = (
    _algorithm_names_the_terms, _mechanism_has_noise, _mechanism_own_check, _planner, _budgets, _rule_sets_client_noise,
    _adaptive_clip, _terms_covered, _noise_then_clip, _aggregate_is_a_sum,
    _mechanism_after_pipeline, _other_stage_inputs,
)


def first_problem(recipe: Recipe) -> str | None:
  """The first rule's one-line message, or None when the recipe is sound."""
  values = recipe.config_values()
  for rule in RULES:
    problem = rule(recipe, values)
    if problem:
      return problem
  return None
