"""One stage protocol for every chain of the round: optax's (init, update) pair,
with the stage's own figures.

    init(*sizes) -> state
    update(x, state, ctx) -> (x, state, metrics)

  x        what the chain transforms: one client's upload (compression/pipeline.py,
           ClientStage), this device's slice of the cohort's uploads
           (core/upload_stages.py, UploadStage), or the server's aggregate update
           (training/server_stages.py, ServerStage)
  state    the stage's own slot (() where it keeps none)
  ctx      what the round gives the chain (keys, the round's numbers, the cohort)
  metrics  the stage's named figures this round, {name: scalar array} ({} for none);
           the round gathers them into RoundStats.metrics[the stage's name] (summed
           over the cohort where a stage runs per client or per device), and a run
           publishes a stage's figure only where the stage declares it (`declares`:
           {name: (status, what it is or reveals)}, experiment/release_registry.py)

Each kind's record adds the static properties the checks and the executor plan by
(what a stage bounds, whether it inspects uploads one by one, ...). Two chains, as
optax has `chain` and `named_chain`: `chain` keeps the stages' states as a tuple in
order (the client pipeline's slot of each client's row), `named_chain` as a dict by
stage name inside a dict it shares (the server state, which also holds the local
terms' and the rule's slots).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

# what a published figure is to the guarantee (experiment/release_registry.py)
COVERED, PUBLIC, NOT_COVERED = "covered", "public", "not covered"


def check_declares(owner: str, declares) -> tuple:
  """A stage's metric declarations, ((metric, status, says), ...), refused in one
  line unless each names a metric (once, without a dot), one of the three statuses
  and a sentence."""
  seen = set()
  for entry in declares:
    ok = (isinstance(entry, tuple) and len(entry) == 3 and all(isinstance(e, str) for e in entry)
          and entry[0] and "." not in entry[0] and entry[0] not in seen
          and entry[1] in (COVERED, PUBLIC, NOT_COVERED) and entry[2])
    if not ok:
      raise ValueError(f"{owner}: declares entry {entry!r}: allowed is (metric, status, what "
                       f"it is or reveals), each metric once and without a dot, with status "
                       f"{COVERED!r}, {PUBLIC!r} or {NOT_COVERED!r}")
    seen.add(entry[0])
  return tuple(declares)


def check_named(stages, kind: str) -> None:
  """A chain's stages that report metrics are kept under their names: each needs one,
  distinct, without a dot (a row's column is '<stage>.<metric>'); their declarations
  are checked too."""
  names = [s.name for s in stages]
  for s in stages:
    if not s.name or "." in s.name or names.count(s.name) > 1:
      raise ValueError(f"{kind} {s.name!r}: a stage of a chain needs a name of its own without "
                       f"a dot (the chain's are {names}): its state slot and metrics go by it")
    check_declares(f"{kind} {s.name!r}", getattr(s, "declares", ()))


def check_metrics(name: str, metrics: Mapping[str, Any]) -> dict:
  """The metrics a stage returned, refused in one line unless a dict of numeric
  scalars under names without a dot (RoundStats stacks one value per round)."""
  if not isinstance(metrics, Mapping):
    raise TypeError(f"stage {name!r}: update returned {type(metrics).__name__} as its metrics; "
                    "allowed is a dict {name: scalar}")
  for key, value in metrics.items():
    scalar = (isinstance(value, (bool, int, float)) or
              (getattr(value, "shape", None) == () and getattr(value, "dtype", None) is not None
               and value.dtype.kind in "biuf"))
    if not (isinstance(key, str) and key and "." not in key and scalar):
      what = getattr(value, "shape", type(value).__name__)
      raise TypeError(f"stage {name!r}: metric {key!r} is {what}; a stage's metrics are "
                      "numeric scalars (one value per round) under names without a dot")
  return dict(metrics)


def call(stage, x, state, ctx):
  """stage.update(x, state, ctx) -> (x, state, metrics), its result checked: an update
  written for another protocol is one line, not an unpacking error deep in a trace."""
  out = stage.update(x, state, ctx)
  if not (isinstance(out, tuple) and len(out) == 3):
    got = f"{len(out)} values" if isinstance(out, tuple) else type(out).__name__
    raise TypeError(f"stage {stage.name!r}: update returned {got}; the protocol is "
                    "update(x, state, ctx) -> (x, state, metrics) (fedjax_dp/stage.py)")
  return out[0], out[1], check_metrics(stage.name, out[2])


def chain_update(stages, ctx_for: Callable | None = None) -> Callable:
  """update(x, states, ctx) -> (x, states, {stage name: metrics}) of `stages` in order,
  `states` a tuple aligned with them. ctx_for(i, ctx): stage i's context (default:
  the chain's). A stage that reports metrics needs a name of its own in the chain."""
  for stage in stages:
    check_declares(f"stage {stage.name!r}", getattr(stage, "declares", ()))

  def update(x, states, ctx):
    new_states, metrics = [], {}
    for i, (stage, s) in enumerate(zip(stages, states)):
      x, s, m = call(stage, x, s, ctx if ctx_for is None else ctx_for(i, ctx))
      new_states.append(s)
      if m:
        if not stage.name or "." in stage.name or stage.name in metrics:
          raise ValueError(f"stage {stage.name!r} reports metrics: it needs a name of its own "
                           "in its chain, without a dot (its metrics are kept under it)")
        metrics[stage.name] = m
    return x, tuple(new_states), metrics
  return update


def named_chain_update(stages) -> Callable:
  """update(x, state, ctx) -> (x, state, {stage name: metrics}) of `stages` in order,
  each on state[its name]; other entries of the dict `state` pass through."""
  check_named(stages, "stage")

  def update(x, state, ctx):
    state, metrics = dict(state), {}
    for stage in stages:
      x, state[stage.name], m = call(stage, x, state[stage.name], ctx)
      if m:
        metrics[stage.name] = m
    return x, state, metrics
  return update


def merge_metrics(*parts: dict) -> dict:
  """{stage name: metrics} of several chains in one dict; a name that reports in two
  is refused (a stage's metrics are kept under its name)."""
  out: dict = {}
  for part in parts:
    for name, m in part.items():
      if name in out:
        raise ValueError(f"two stages named {name!r} report metrics; a stage's metrics are "
                         "kept under its name: rename one")
      out[name] = m
  return out
