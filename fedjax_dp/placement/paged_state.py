"""Per-client state outside device memory: a host table paged into the device.

With `client_state_store: host` or `disk` the per-client state (SCAFFOLD's
control variates, TopkSDP-FL's residuals, MOON's previous models, ...) does not
live on the device as a dense `[num_clients, ...]` table. It lives in a
`HostTable` (numpy arrays in host memory, or numpy memory-mapped files on disk,
stored float32 or bfloat16), and the simulation runs in pages of
`client_state_page_rounds` rounds:

  1. the page's cohorts are drawn ahead, with the rounds' own keys and sampler
     (`draw_cohorts`: the same ids the compiled rounds then draw);
  2. the union U of their clients is gathered from the table into a device
     page `PagedRows(rows [capacity, ...], row_of [num_clients])`, capacity =
     page rounds x cohort slots, row_of[c] = c's row in the page (capacity: not
     in the page);
  3. the compiled rounds read and write page rows through row_of (the executor's
     replicated-table path, unchanged);
  4. the page's rows are scattered back into the table.

Device memory is then set by the page, not the population. Stored float32 the
results are bit for bit those of the device table (tests/test_paged_state.py);
bfloat16 halves the table and rounds each row to 8 bits of mantissa whenever
it is stored.

Rows nobody has written yet read as round 0's row, so a table of a million
clients costs nothing until clients take part (no table-sized initialisation).
A disk table's files are unlinked as soon as they are mapped: they take disk
space while the table lives and vanish with it, even if the process is killed.
"""

from __future__ import annotations

import os
import tempfile
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

STORES = ("device", "host", "disk")
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


class PagedRows(NamedTuple):
  """A page of the per-client state on the device (see the module docstring)."""
  rows: Any            # per-client pytree, leaves [capacity, ...]
  row_of: jax.Array    # int32 [num_clients]: each client's row in `rows`; capacity if absent


class HostTable:
  """Every client's state rows off the device: one [num_clients, row size] array per
  leaf of the per-client pytree, in host memory ('host') or in memory-mapped
  files ('disk', under `directory`). Float32 leaves are stored as `dtype`
  ('float32' or 'bfloat16'); others as they are. Updated in place by the
  simulation, as donated device buffers are: a state you passed to run_rounds
  no longer holds the rows of the round it was at."""

  def __init__(self, init_row: Any, num_clients: int, *, kind: str = "host",
               dtype: str = "float32", directory: str | None = None):
    if kind not in ("host", "disk"):
      raise ValueError(f"HostTable kind {kind!r}: allowed are 'host', 'disk'")
    leaves, self.treedef = jax.tree.flatten(init_row)
    self.shapes = [np.shape(a) for a in leaves]
    self.dtypes = [np.asarray(a).dtype for a in leaves]
    self.init = [np.asarray(a).reshape(-1) for a in leaves]
    self.num_clients, self.kind, self.dtype = num_clients, kind, dtype
    stored = [DTYPES[dtype] if d == np.float32 else d for d in self.dtypes]
    self.tables = [self._allocate((num_clients, a.size), s, directory)
                   for a, s in zip(self.init, stored)]
    self.written = np.zeros(num_clients, bool)

  def _allocate(self, shape, dtype, directory):
    if self.kind == "host":
      return np.zeros(shape, dtype)   # pages are mapped when first written
    fd, path = tempfile.mkstemp(prefix="client_state-", suffix=".bin",
                                dir=directory or tempfile.gettempdir())
    try:
      os.ftruncate(fd, int(np.prod(shape)) * np.dtype(dtype).itemsize)   # sparse: no blocks yet
      table = np.memmap(path, dtype=dtype, mode="r+", shape=shape)
    finally:
      os.close(fd)
      os.unlink(path)   # the mapping keeps the file alive; nothing is left behind
    return table

  @property
  def nbytes(self) -> int:
    """Bytes the whole table takes once every client has been written."""
    return sum(t.nbytes for t in self.tables)

  def gather(self, ids: np.ndarray, capacity: int) -> Any:
    """The rows of clients `ids` [n] (n <= capacity) as a per-client pytree of
    float32 (or the leaf's own dtype) numpy arrays [capacity, ...]; rows past n are
    zeros, unwritten clients read round 0's row."""
    fresh = ~self.written[ids]
    out = []
    for table, init, shape, dtype in zip(self.tables, self.init, self.shapes, self.dtypes):
      rows = np.zeros((capacity, init.size), dtype)
      rows[:len(ids)][fresh] = init
      rows[:len(ids)][~fresh] = table[ids[~fresh]]   # only written rows are read
      out.append(rows.reshape((capacity,) + shape))
    return jax.tree.unflatten(self.treedef, out)

  def scatter(self, ids: np.ndarray, rows: Any) -> None:
    """Writes the first len(ids) rows of `rows` (a pytree as `gather` returns) back."""
    for table, leaf in zip(self.tables, self.treedef.flatten_up_to(rows)):
      table[ids] = np.asarray(leaf[:len(ids)]).reshape(len(ids), -1).astype(table.dtype)
    self.written[ids] = True

  def rows(self, ids) -> Any:
    """Clients `ids`' rows (unpadded), e.g. to inspect a few clients' state."""
    ids = np.asarray(ids)
    return jax.tree.map(lambda a: a[:len(ids)], self.gather(ids, len(ids)))


# A leafless pytree node: a SimState holding a HostTable can be placed, mapped and
# printed as any other; jit never sees it (the simulation swaps in a PagedRows).
jax.tree_util.register_pytree_node(HostTable, lambda t: ((), t), lambda t, _: t)


def page_of(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """The sorted distinct clients of a page's cohorts (ids, mask [rounds, slots])."""
  return np.unique(np.asarray(ids)[np.asarray(mask)])


@partial(jax.jit, static_argnums=(1,))
def row_index(clients: jax.Array, num_clients: int) -> jax.Array:
  """int32 [num_clients]: client clients[j] -> j; others -> len(clients) (the page's
  capacity; padded entries of `clients` [capacity] are num_clients and are dropped)."""
  capacity = clients.shape[0]
  empty = jnp.full((num_clients,), capacity, jnp.int32)
  return empty.at[clients].set(jnp.arange(capacity, dtype=jnp.int32), mode="drop")


class Paging(NamedTuple):
  """How a simulation whose per-client state is a HostTable runs (make_paging)."""
  draw_cohorts: Any    # (key, first round, client_count, rounds) -> ids, mask [rounds, slots]
  page_rounds: int     # rounds a page runs
  capacity: int        # rows a page holds: page_rounds x cohort slots
  make_table: Any      # round 0's row of one client -> HostTable
  num_clients: int


def make_paging(round_cohort, num_clients: int, *, kind: str, dtype: str, page_rounds: int,
                slots: int, directory: str | None) -> Paging:
  """round_cohort(key, round, client_count) -> (ids, mask) [slots]: the cohort the
  compiled round draws, which the page's rows are gathered for ahead of it."""
  @partial(jax.jit, static_argnums=(3,))
  def draw_cohorts(key, first_round, client_count, rounds: int):
    return jax.lax.map(lambda r: round_cohort(key, r, client_count),
                       first_round + jnp.arange(rounds, dtype=first_round.dtype))

  make_table = partial(HostTable, num_clients=num_clients, kind=kind, dtype=dtype,
                       directory=directory)
  return Paging(draw_cohorts, page_rounds, page_rounds * slots, make_table, num_clients)


def run_pages(paging: Paging, run_chunk, state, num_rounds: int, client_count, place):
  """run_chunk(state, rounds) -> (state, stats [rounds]) for a state whose
  client_state is a HostTable: page by page, the page's rows on the device
  (placed by `place`) as a PagedRows, written back after it. Returns the state
  (holding the same, updated, table) and the stats of all num_rounds rounds."""
  table, n, chunks = state.client_state, paging.num_clients, []
  for start in range(0, num_rounds, paging.page_rounds):
    rounds = min(paging.page_rounds, num_rounds - start)
    clients = page_of(*paging.draw_cohorts(state.key, state.round, client_count, rounds))
    padded = np.full(paging.capacity, n, np.int32)
    padded[:len(clients)] = clients
    page = PagedRows(place(table.gather(clients, paging.capacity)),
                     place(row_index(place(padded), n)))
    state, stats = run_chunk(state._replace(client_state=page), rounds)
    table.scatter(clients, jax.device_get(state.client_state.rows))
    state = state._replace(client_state=table)
    chunks.append(stats)
  return state, jax.tree.map(lambda *a: jnp.concatenate(a), *chunks)
