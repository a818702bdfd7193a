"""The simulation's state, a round's statistics, the key tags, and round 0's state.

Keys: the run key is the release's (recipes/release_identity.py: the seed with
the digest of the settings and inputs folded in, so that releases that differ
in anything never share a draw); round r uses fold_in(run_key, r); within it,
purpose tags separate the cohort draw from client training, and client c trains
with fold_in(fold_in(round_key, CLIENT_TRAINING), c). No key is used twice.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp import recipes
from fedjax_dp.models import Model
from fedjax_dp.privacy.mechanisms.base import initial_state

# fold_in tags: one per random purpose inside a round
COHORT_SAMPLING = 0
CLIENT_TRAINING = 1
SERVER_NOISE = 2
LOCAL_NOISE = 3
CLIP_COUNT_NOISE = 4
PIPELINE = 5
SHUFFLE = 6  # reserved: the simulated mean needs no permutation (client_phase.py)
KEPT_NOISE = 7
DOWNLINK = 8
BYZANTINE = 9
BYZANTINE_DRAW = 10   # byzantine_draw 'round': who is malicious this round
REPORT_NOISE_SUM = 11  # local DP's reports' noise drawn once for their sum
MODEL_INIT = 2**20  # folded into the run key itself; config keeps rounds below it
SAMPLER_INIT = 2**20 + 1   # folded into the run key: the sampler's state (its bins)


class SimState(NamedTuple):
  """Everything a run needs to continue bit for bit; saved whole by checkpoints."""
  round: jax.Array            # int32 scalar: rounds completed
  params: Any                 # server model
  server_opt_state: Any       # optax state of the server optimizer
  client_state: Any           # per-client pytrees, leading axis [num_clients] (empty for FedAvg)
  server_state: Any           # the algorithm's server-side state (e.g. SCAFFOLD's control variate)
  key: jax.Array              # uint32[2] run key
  participations: jax.Array   # int32: client participations so far (for bytes)
  cohort_overflow: jax.Array  # int32: Poisson draws dropped for lack of cohort room
  privacy: Any                # the mechanism's slot (privacy/mechanisms/base.PrivacyState:
                              # the RDP ledger or ledgers, the next round's clip norm)
  sampler: Any = ()           # the cohort sampler's (placement/cohort.Sampler): () for most;
                              # balls_in_bins' bins, min_sep's last rounds [num_clients]


class RoundStats(NamedTuple):
  loss_sum: jax.Array      # sum of local minibatch losses weighted by batch examples
  examples: jax.Array      # example-visits in local training this round
  participants: jax.Array  # int32 clients that trained this round
  spent: jax.Array         # int32 cohort draws refused because the client's budget is spent
  event: jax.Array         # int32 what the round released, for the host's privacy log:
                           # the index into Privacy.event_multipliers of the noise the
                           # accountant charged (central DP; local DP: 0 when anyone took
                           # part, static noise), -1 when nothing was released, -2 for
                           # local DP's scheduled noise (composed in the clients' ledgers)
  lr: jax.Array            # float32 the clients' learning rate this round
  nonfinite: jax.Array     # int32 uploads with a NaN or inf, replaced by zero before the
                           # mechanism (DP or kept noise; unnoised diagnostic)
  # {stage name: {metric: scalar}}: each stage's own figures (fedjax_dp/stage.py),
  # summed over the cohort: the mechanism's `unclipped`, the rule's (`aggregator`)
  # `flagged` and `clusters`, the server norm bound's (`server_clip`) `bounded`, and
  # whatever a client, upload or server stage of the recipe reports
  metrics: dict

  def metric(self, stage: str, name: str):
    """metrics[stage][name], or zeros shaped like `participants` where the stage
    did not run or report it."""
    value = self.metrics.get(stage, {}).get(name)
    if value is not None:
      return value
    zeros = np.zeros_like if isinstance(self.participants, np.ndarray) else jnp.zeros_like
    return zeros(self.participants)

  # int32 participants whose update norm was <= the clip norm
  unclipped = property(lambda self: self.metric("mechanism", "unclipped"))
  # int32 uploads the aggregator flagged as outliers or left out
  flagged = property(lambda self: self.metric("aggregator", "flagged"))
  # int32 clusters the `cluster` aggregator formed (0 otherwise)
  clusters = property(lambda self: self.metric("aggregator", "clusters"))
  # int32 received uploads the server's norm bound clipped
  bounded = property(lambda self: self.metric("server_clip", "bounded"))


# the stages' metrics RoundStats reads as attributes (above), which a run publishes
# under names of their own (unclipped_fraction, flagged, clusters, norm_bounded); any
# other stage metric is published as '<stage>.<metric>' (experiment/callbacks.py)
ATTRIBUTE_METRICS = frozenset({("mechanism", "unclipped"), ("aggregator", "flagged"),
                               ("aggregator", "clusters"), ("server_clip", "bounded")})


def secret_run_key() -> jax.Array:
  """A uint32[2] PRNG key from the operating system's entropy (os.urandom); in a
  run of many processes, process 0's (every process must run the same rounds)."""
  from fedjax_dp.placement.processes import from_primary
  return jnp.asarray(from_primary(np.frombuffer(os.urandom(8), np.uint32).copy()))


def init_state(setup: "recipes.RunSetup", recipe: "recipes.Recipe", model: Model,
               run_key: jax.Array, client_table=None, privacy=None,
               sampler_init=None) -> SimState:
  """Round 0's state with `run_key` (release_identity.run_key). The model's
  initialisation is the seed's alone (it reads no data). `client_table(one_client_row)
  -> client_state` holds the per-client rows (default: a dense [num_clients, ...]
  device table; a HostTable for client_state_store host/disk, placement/paged_state.py).
  `privacy` (privacy/setup.Privacy) for a mechanism whose slot holds more than the
  ledger (a correlated-noise strategy's buffers). `sampler_init(key) -> state`: the
  cohort sampler's (placement/cohort.Sampler.init; default none)."""
  num_clients = setup.population.num_clients
  params = model.init(jax.random.fold_in(jax.random.PRNGKey(setup.seed), MODEL_INIT))
  server_opt = recipe.server_optimizer_fn()
  mechanism = recipe.privacy.stage if recipe.privacy is not None else None
  objective = recipe.objective(momentum=setup.training.momentum)
  one_client = objective.init_client_state(params)
  server_state = objective.init_server_state(params)
  d = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  client_pipeline = recipe.client_pipeline()
  if client_pipeline is not None:
    one_client["pipeline"] = client_pipeline.init(d)
  aggregator = recipe.rule
  if aggregator.stateful:   # only then: a stateless rule's runs keep their state pytree
    server_state["aggregator"] = aggregator.init(d, num_clients)
  server_state.update(recipe.server_stages(num_clients, DOWNLINK).init(params, d))
  client_state = (client_table(one_client) if client_table is not None else
                  jax.tree.map(lambda a: jnp.broadcast_to(a, (num_clients,) + a.shape),
                               one_client))
  return SimState(round=jnp.int32(0), params=params, server_opt_state=server_opt.init(params),
                  client_state=client_state, server_state=server_state,
                  key=run_key, participations=jnp.int32(0),
                  cohort_overflow=jnp.int32(0),
                  privacy=initial_state(mechanism, num_clients, setup.clip_norm, params,
                                        privacy),
                  sampler=sampler_state(sampler_init, run_key))


def sampler_state(sampler_init, run_key: jax.Array):
  """The cohort sampler's state for run key `run_key` (() without a sampler): a state
  given another run key must take this with it, or its rounds would repeat their
  noise under other cohorts."""
  return () if sampler_init is None else sampler_init(jax.random.fold_in(run_key, SAMPLER_INIT))
