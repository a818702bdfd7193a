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
  line unless each names a metric, one of the three statuses and a sentence."""
  for entry in declares:
    ok = (isinstance(entry, tuple) and len(entry) == 3 and all(isinstance(e, str) for e in entry)
          and entry[1] in (COVERED, PUBLIC, NOT_COVERED))
    if not ok:
      raise ValueError(f"{owner}: declares entry {entry!r}: allowed is (metric, status, what "
                       f"it is or reveals) with status {COVERED!r}, {PUBLIC!r} or "
                       f"{NOT_COVERED!r}")
  return tuple(declares)


def check_metrics(name: str, metrics: Mapping[str, Any]) -> dict:
  """The metrics a stage returned, refused in one line unless a dict of scalars
  (RoundStats stacks one value per round)."""
  if not isinstance(metrics, Mapping):
    raise TypeError(f"stage {name!r}: update returned {type(metrics).__name__} as its metrics; "
                    "allowed is a dict {name: scalar}")
  for key, value in metrics.items():
    if getattr(value, "shape", ()) != ():
      raise TypeError(f"stage {name!r}: metric {key!r} has shape {value.shape}; a stage's "
                      "metrics are scalars (one value per round)")
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
  the chain's)."""
  def update(x, states, ctx):
    new_states, metrics = [], {}
    for i, (stage, s) in enumerate(zip(stages, states)):
      x, s, m = call(stage, x, s, ctx if ctx_for is None else ctx_for(i, ctx))
      new_states.append(s)
      if m:
        metrics[stage.name] = m
    return x, tuple(new_states), metrics
  return update


def named_chain_update(stages) -> Callable:
  """update(x, state, ctx) -> (x, state, {stage name: metrics}) of `stages` in order,
  each on state[its name]; other entries of the dict `state` pass through."""
  names = [s.name for s in stages]
  if len(set(names)) != len(names):
    raise ValueError(f"stages {names}: a named chain's slots need distinct names")

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
