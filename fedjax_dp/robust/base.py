"""The aggregator protocol: the server's rule over the cohort's flat uploads.

An aggregator is a NamedTuple of pure functions and static properties, one
module each in this package and one line in `registry.AGGREGATORS`:

  init(d, num_clients) -> state          its state (() when stateless)
  aggregate(u, mask, weights, state, hp[, ids]) -> (aggregate [d], state, metrics)
      u [m, d] the cohort's uploads, mask [m] bool (padded or refused slots are
      False and never influence anything), weights [m] the round's weights (example
      counts, or ones), hp {name: number} its hyperparameters (its `hparams`), ids
      [m] the uploads' client ids (only to a rule with `takes_ids`); metrics
      {"flagged": int32, "clusters": int32} and those it `declares`

Static properties the round, the executor and recipes/validate.py read:
  linear     a weighted mean: the round sums it in its fused psum path (never
             calling `aggregate`), and only it computes the sum of clipped updates
             central DP's noise is calibrated to, or a sum over per-layer shuffled
             tuples; every other rule inspects each whole upload
  stateful   keeps state between rounds: the round stores it in
             server_state["aggregator"] (only then, so stateless set-ups keep their
             state pytree) and passes it back in the next round
  reports    the metrics that mean something for it, for metrics.jsonl
  declares   its own metrics beyond those two, with their privacy status
             (fedjax_dp/stage.py); they reach RoundStats.metrics["aggregator"]
  takes_ids  aggregate is also given the uploads' client ids
  client_noise  (state) -> [num_clients] float32: each client's factor on its next
             local noise, set by the rule's state (per-cluster noise: the cluster
             rule built with noise='equalize', robust/cluster.py); None: ones. The
             local DP mechanism reads it, and charges each client for its noise
  hparams    its numbers {name: number}, from its constructor (centered_clip(tau=1.0))
  check      (hparams, clients_per_round) -> a one-line config error, or None (its
             numbers against the cohort: Krum's f and m)

hp's numbers are call arguments, never baked in: the round passes the rule's
numbers as float32 (counts int32) arrays, which may be traced (vmapped over
replicas, changed without recompiling). A config key feeds a constructor
argument through its row in config/keys.py (`feeds`).
"""

from __future__ import annotations

import types
from typing import Any, Callable, Mapping, NamedTuple

import jax.numpy as jnp

from fedjax_dp.kernels import robust_aggregation as ra


def stateless(d: int, num_clients: int):
  return ()


def _no_check(hparams, clients_per_round):
  return None


class Aggregator(NamedTuple):
  name: str
  aggregate: Callable                            # (u, mask, weights, state, hp) -> ...
  hparams: Mapping[str, Any] = types.MappingProxyType({})   # its numbers
  init: Callable[[int, int], Any] = stateless    # (d, num_clients) -> state
  linear: bool = False
  stateful: bool = False
  reports: tuple[str, ...] = ()
  check: Callable[[Mapping, int], str | None] = _no_check
  declares: tuple = ()        # its own metrics beyond flagged and clusters, with their
                              # release declarations ((name, status, says), ...; stage.py)
  takes_ids: bool = False     # aggregate(..., ids): the uploads' client ids [m]
  client_noise: Callable | None = None   # (state) -> [num_clients] noise factors


def metrics(flagged=None, clusters=None) -> dict:
  """{"flagged", "clusters"} as int32 scalars (0 where not given)."""
  zero = jnp.zeros((), jnp.int32)
  return {"flagged": zero if flagged is None else flagged,
          "clusters": zero if clusters is None else clusters}


def on_finite_uploads(rule: Callable) -> Callable:
  """Wraps `rule` (same signature as `aggregate`) so it sees only finite uploads:
  a participant whose upload holds a NaN or an inf is left out before the rule
  runs (ra.finite_participants) and counted in metrics["flagged"]."""
  def aggregate(u, mask, weights, state, hp, *ids):
    u, usable, dropped = ra.finite_participants(u, mask)
    agg, state, out = rule(u, usable, weights, state, hp, *ids)
    return agg, state, {**out, "flagged": out["flagged"] + dropped}
  return aggregate
