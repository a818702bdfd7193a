"""The cohort on the devices: who trains this round, and on which device.

  make_sampler(...)     (key, client_count, round) -> (ids [slots], mask [slots],
                        overflow): the round's cohort (store.sample_cohort, or
                        participation.cyclic_groups' group of the round), dealt to the
                        devices by size (deal_by_size)
  resident_layout(...)  the per-client table in client order <-> resident order
                        (each device holds the rows of the clients it trains)
  sharded_layout(...)   the per-client table in client order <-> blocks of ids
                        sharded over the devices (executor.table_rows)
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fedjax_dp.placement import participation
from fedjax_dp.placement.store import sample_cohort


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


def make_sampler(*, resident: bool, num_clients: int, clients_per_round: int, sampling: str,
                 capacity: int, n_dev: int, slots: int, home=None,
                 data_seed: int = 0) -> Callable:
  """(key, client_count, round) -> (ids [slots], mask [slots], overflow int32): the
  cohort drawn from `key` (sampling 'cyclic': group round mod b of
  participation.cyclic_groups, by the data seed) and dealt to the devices; with
  resident state everyone, each in its home slot (`home`: home_slots' result)."""
  if resident:
    home_ids, home_mask, _ = home
    return lambda key, client_count, r: (jnp.asarray(home_ids), jnp.asarray(home_mask),
                                         jnp.int32(0))
  if sampling == "cyclic":
    groups = participation.cyclic_groups(num_clients, clients_per_round, data_seed)

    def cyclic(key, client_count, r):
      ids = jnp.asarray(groups)[r % groups.shape[0]]
      ids, mask = deal_by_size(ids, jnp.ones_like(ids, bool), client_count, n_dev, slots)
      return ids, mask, jnp.int32(0)
    return cyclic

  def sample(key, client_count, r):
    cohort = sample_cohort(key, num_clients, clients_per_round, sampling, capacity)
    ids, mask = deal_by_size(cohort.ids, cohort.mask, client_count, n_dev, slots)
    return ids, mask, cohort.overflow
  return sample


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
