"""The cohort on the devices: who trains this round, and on which device.

  make_sampler(...)     Sampler(init, draw): the cohort of the participation schema
                        (placement/participation.py) the accountant reads; draw(key,
                        client_count, round, state) -> (ids [slots], mask [slots],
                        overflow, state), dealt to the devices by size (deal_by_size)
  resident_layout(...)  the per-client table in client order <-> resident order
                        (each device holds the rows of the clients it trains)
  sharded_layout(...)   the per-client table in client order <-> blocks of ids
                        sharded over the devices (executor.table_rows)
"""

from __future__ import annotations

from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fedjax_dp.placement import participation
from fedjax_dp.placement.store import Cohort, sample_cohort


def deal_by_size(ids: jax.Array, mask: jax.Array, client_count: jax.Array, n_dev: int,
                 slots: int) -> tuple[jax.Array, jax.Array]:
  """Orders the cohort for the devices: [slots] ids and mask, `slots` a multiple of n_dev.

  Clients are sorted by size and dealt round-robin, so device d gets ranks
  d, d + n_dev, ... as one contiguous block: every device gets a similar
  amount of work, and within a device neighbours have similar sizes (a
  `lax.map` group runs as many steps as its largest client). Aggregation is a
  weighted sum, so the order changes no result beyond float rounding.
  """
  pad = slots - ids.shape[0]
  ids, mask = jnp.pad(ids, (0, pad)), jnp.pad(mask, (0, pad))
  size = jnp.where(mask, client_count[ids], -1)
  # ties by id: the same cohort is dealt the same way whatever order it was drawn in
  order = jnp.lexsort((ids, size)).reshape(slots // n_dev, n_dev).T.reshape(-1)
  return ids[order], mask[order]


def home_slots(num_clients: int, client_count, n_dev: int, slots: int):
  """Every client's slot when every client takes part every round: (home_ids
  [slots] the client of each slot, home_mask [slots], home_pos [num_clients] each
  client's slot), numpy. deal_by_size breaks ties by id, so the draw's order does
  not matter and every round deals the same way."""
  every = jnp.arange(num_clients, dtype=jnp.int32)
  home_ids, home_mask = (np.asarray(a) for a in deal_by_size(
      every, jnp.ones_like(every, bool), client_count, n_dev, slots))
  home_pos = np.zeros(num_clients, np.int32)
  home_pos[home_ids[home_mask]] = np.flatnonzero(home_mask)
  return home_ids, home_mask, home_pos


class Sampler(NamedTuple):
  """A cohort sampler: what persists across its rounds is in its state (SimState.sampler)."""
  init: Callable        # (key) -> state: () for most; balls_in_bins' bins [num_clients],
                        # min_sep's last round taken part [num_clients] (warm started)
  draw: Callable        # (key, client_count, round, state) -> (ids [slots], mask [slots],
                        # overflow int32, state): round `round`'s cohort, dealt to the devices
  ahead: bool = True    # a round's cohort follows from its key and the init key alone
                        # (paged client state draws it ahead); min_sep's does not


def make_sampler(*, resident: bool, schema: participation.Participation, capacity: int,
                 n_dev: int, slots: int, home=None, data_seed: int = 0) -> Sampler:
  """The sampler `schema` describes (placement/participation.py, the same schema the
  accountant reads), dealt to the devices; with resident state everyone, each in
  its home slot (`home`: home_slots' result)."""
  if resident:
    home_ids, home_mask, _ = home
    return _stateless(lambda key, client_count, r: (jnp.asarray(home_ids), jnp.asarray(home_mask),
                                                    jnp.int32(0)))
  s = schema
  if s.sampling in ("fixed", "poisson"):
    return _stateless(lambda key, client_count, r: _dealt(
        sample_cohort(key, s.num_clients, s.clients_per_round, s.sampling, capacity),
        client_count, n_dev, slots))
  if s.sampling in ("cyclic", "cyclic_poisson"):
    groups = participation.cyclic_groups(s.num_clients, s.min_sep, data_seed)
    q = 1.0 if s.sampling == "cyclic" else s.sampling_prob
    return _stateless(lambda key, client_count, r: _dealt(
        _within(key, jnp.asarray(groups)[r % s.min_sep], q, capacity), client_count, n_dev,
        slots))
  if s.sampling == "balls_in_bins":
    def init(key):
      return jax.random.randint(key, (s.num_clients,), 0, s.min_sep, jnp.int32)

    def draw(key, client_count, r, bins):
      return (*_dealt(_members(bins == r % s.min_sep, capacity), client_count, n_dev, slots),
              bins)
    return Sampler(init, draw)
  if s.sampling == "min_sep":
    return Sampler(partial(_min_sep_init, s), partial(_min_sep_draw, s, capacity, n_dev, slots),
                   ahead=False)
  raise ValueError(f"unknown sampling {s.sampling!r}")


def _stateless(draw: Callable) -> Sampler:
  return Sampler(lambda key: (), lambda key, client_count, r, state: (
      *draw(key, client_count, r), state))


def _dealt(cohort: Cohort, client_count, n_dev: int, slots: int):
  ids, mask = deal_by_size(cohort.ids, cohort.mask, client_count, n_dev, slots)
  return ids, mask, cohort.overflow


def _members(joined: jax.Array, capacity: int, ids: jax.Array | None = None) -> Cohort:
  """The clients where `joined` [clients] (or ids[joined]), in `capacity` slots;
  those beyond it counted in overflow."""
  (pos,) = jnp.nonzero(joined, size=capacity, fill_value=0)
  total = joined.sum(dtype=jnp.int32)
  chosen = pos if ids is None else ids[pos]
  return Cohort(chosen.astype(jnp.int32), jnp.arange(capacity) < total,
                jnp.maximum(total - capacity, 0))


def _within(key, group: jax.Array, q: float, capacity: int) -> Cohort:
  """Each client of `group` [size] with probability q (1: all of them)."""
  if q >= 1.0 and capacity == group.shape[0]:   # (sampling 'cyclic')
    return Cohort(group, jnp.ones_like(group, bool), jnp.int32(0))
  if q >= 1.0:
    pad = capacity - group.shape[0]
    return Cohort(jnp.pad(group, (0, pad)), jnp.arange(capacity) < group.shape[0],
                  jnp.int32(0))
  return _members(jax.random.bernoulli(key, q, group.shape), capacity, group)


MIN_SEP_NEVER = -(2**30)   # min_sep's "last took part" of a client that has not


def _min_sep_init(s: participation.Participation, key) -> jax.Array:
  """int32 [num_clients]: the round each client last took part, warm started at the
  process's steady state (jax-privacy's BMinSepSampling): with probability
  (b - 1) p / (1 + (b - 1) p) a client took part in one of the b - 1 rounds before
  round 0, uniformly, so the first cohorts are already of the steady size."""
  b, p = s.min_sep, s.sampling_prob
  held, when = jax.random.split(key)
  recent = jax.random.bernoulli(held, (b - 1) * p / (1 + (b - 1) * p), (s.num_clients,))
  last = -jax.random.randint(when, (s.num_clients,), 1, max(b, 2), jnp.int32)
  return jnp.where(recent & (b > 1), last, MIN_SEP_NEVER)


def _min_sep_draw(s: participation.Participation, capacity: int, n_dev: int, slots: int,
                  key, client_count, r, last):
  """Each client who sat out the last b - 1 rounds joins with probability p; who
  joins (within the cohort's room) takes part now."""
  eligible = r - last >= s.min_sep
  joined = eligible & jax.random.bernoulli(key, s.sampling_prob, (s.num_clients,))
  cohort = _members(joined, capacity)
  took = jnp.zeros((s.num_clients,), bool).at[cohort.ids].max(cohort.mask)
  return (*_dealt(cohort, client_count, n_dev, slots), jnp.where(took, r, last))


def resident_layout(mesh: Mesh, home) -> dict:
  """{to_working, to_client_order}: SimState -> SimState, moving client_state
  between client order (replicated) and the resident order (sharded over
  "clients", device d holding its own slots' rows)."""
  home_ids, _, home_pos = home
  to_slots = jax.jit(lambda table: jax.tree.map(
      lambda a: jax.lax.with_sharding_constraint(a[home_ids], NamedSharding(mesh, P("clients"))),
      table), donate_argnums=(0,))
  to_clients = jax.jit(lambda table: jax.tree.map(
      lambda a: jax.lax.with_sharding_constraint(a[home_pos], NamedSharding(mesh, P())),
      table))
  return dict(
      to_working=lambda state: state._replace(client_state=to_slots(state.client_state)),
      to_client_order=lambda state: state._replace(client_state=to_clients(state.client_state)))


def sharded_layout(mesh: Mesh, num_clients: int, rows: int) -> dict:
  """{to_working, to_client_order} for a table sharded in blocks of `rows` ids
  (executor.table_rows): padded to [devices * rows, ...] and sharded over
  "clients" for the rounds; trimmed to [num_clients, ...] and replicated, as
  the other layouts give it, for whoever reads it between chunks."""
  pad = mesh.devices.size * rows - num_clients
  to_blocks = jax.jit(lambda table: jax.tree.map(
      lambda a: jax.lax.with_sharding_constraint(
          jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1)), NamedSharding(mesh, P("clients"))),
      table), donate_argnums=(0,))
  to_clients = jax.jit(lambda table: jax.tree.map(
      lambda a: jax.lax.with_sharding_constraint(a[:num_clients], NamedSharding(mesh, P())),
      table))
  return dict(
      to_working=lambda state: state._replace(client_state=to_blocks(state.client_state)),
      to_client_order=lambda state: state._replace(client_state=to_clients(state.client_state)))
