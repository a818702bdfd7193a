"""The executor: how each device runs its slice of the cohort.

The round hands the executor one client's work, fn(args_i, state_row_i) ->
(outputs_i, new_row_i), and the executor decides, once at build time and from
the stages' properties and the platform (never from feature flags):

  parallelism   'map': a sequential lax.map over groups of `batch` clients (CPU,
                where XLA's batched matmul is slow: BENCHMARKS.md); 'vmap': groups
                of `batch` clients vmapped (GPU; default 256 a group, so memory
                is set by the group, not the cohort); 'one_step': every client's
                local work is one SGD step from the global model, and the sum of
                the uploads is one gradient over the cohort's examples, in chunks
                of `batch` clients (core/one_step.py; under DP each client's clip
                from its gradient's norm, core/one_step_clipped.py); 'low_rank':
                a few small SGD steps a client on a model of dense layers, each
                step the cohort's rows against the shared model plus each
                client's low-rank correction, in chunks of `batch` clients
                (core/low_rank_steps.py)
  resident      whether per-client state rows live on the device that trains them
                (every client in every round: the cohort and its dealing never
                change), or in a [num_clients, ...] table each device reads its
                cohort's rows from and writes them back to (a host table's page
                of the round's cohort is resident: placement/paged_state.py)
  table_rows    with such a table on several devices, the rows each device holds:
                the table is sharded over "clients" in blocks of client ids, so
                its memory is split over the devices instead of copied on each
                (0: one device, which holds it whole)
  fused_sum     whether the aggregate is a weighted sum no stage needs the stacked
                uploads for (no attack, a linear aggregator, no server clipping,
                no audit canaries): then each upload, after DP's client half
                where there is one, is added into a running sum inside the
                client loop instead of being stacked [clients, d]
  keep_rows     whether a slot that does not take part must return its row
                unchanged (only a resident table whose clients can be refused)

and the cohort's placement: `make_sampler` draws the round's cohort and deals it
to the devices (cohort.deal_by_size); `resident_layout` and `sharded_layout`
convert the per-client table between client order and the resident (dealing)
order or the blocks of ids.

Everything here runs inside shard_map over the mesh axis "clients".
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P


class Executor(NamedTuple):
  """How each device runs its clients (static, see the module docstring)."""
  parallelism: str   # 'map' | 'vmap' | 'one_step' | 'low_rank'
  batch: int         # clients per step of the loop (vmapped together; one_step, low_rank:
                     # per chunk)
  resident: bool
  fused_sum: bool
  keep_rows: bool
  width: int = 0     # one_step: the example rows' width (the largest client)
  table_rows: int = 0   # rows of a sharded (non-resident) table on each device; 0: replicated

  @property
  def client_state_spec(self) -> P:
    """The per-client table's sharding inside the round."""
    return P("clients") if self.resident or self.table_rows else P()

  def map_clients(self, fn: Callable, args, client_state, cohort_ids: jax.Array,
                  cohort_mask: jax.Array, num_clients: int, sums=None):
    """fn over this device's slots -> (outputs, client_state). args leaves [local, ...]
    (slot i's client cohort_ids[i]); client_state as `client_state_spec` says.
    With `sums` (a pytree of zeros; only where fused_sum), fn returns
    ((outputs_i, summed_i), row) and outputs come back as (stacked, summed)."""
    if self.resident:
      return map_clients_with_resident_state(fn, args, client_state, self.batch, sums)
    # refused and padded slots write nothing back (a padded slot may repeat a real id)
    if self.table_rows:   # (num_clients could be a padding row of the last device's block)
      write_ids = jnp.where(cohort_mask, cohort_ids, jnp.iinfo(jnp.int32).max)
      return map_clients_with_sharded_state(fn, args, client_state, cohort_ids, write_ids,
                                            self.batch, self.table_rows, sums)
    write_ids = jnp.where(cohort_mask, cohort_ids, num_clients)
    return map_clients_with_state(fn, args, client_state, cohort_ids, write_ids, self.batch,
                                  sums)


VMAP_GROUP = 256   # clients vmapped together by default: per-client model copies are
                   # [group, d], never [cohort, d] (a 10,000-client cohort of the
                   # FMNIST MLP would be 8 GB per copy)
ONE_STEP_EXAMPLES = 1024    # examples per one_step chunk: activations that stay in cache
                            # (FMNIST MLP, 2-core CPU: chunks of 256-1024 examples ran
                            # 1.5x faster than one 30,000-example batch a device)
LOW_RANK_ROWS = 256         # a low_rank chunk's rows over all its clients' steps (FMNIST
                            # MLP, 2-core CPU, 12 rows a client: chunks of 16-32 clients
                            # ran 1.2x faster than 85; core/low_rank_steps.py)


def plan_executor(mesh: Mesh, *, parallelism: str, client_batch: int, slots: int,
                  num_clients: int, per_client_state: bool, full_participation: bool,
                  resident: bool | None, stacks_uploads: bool,
                  refuses_clients: bool, one_step_width: int = 0, low_rank_rows: int = 0,
                  paged: bool = False, shard_table: bool = True) -> Executor:
  """The executor for a round whose stages have these properties.

  parallelism: 'auto' (one_step where the clients allow it, else map on CPU and
  vmap elsewhere), 'map', 'vmap' or 'one_step'; client_batch: clients per group
  (0: 1 for map, VMAP_GROUP for vmap, ONE_STEP_EXAMPLES examples for one_step);
  slots: the cohort's padded size (a multiple of the mesh size); per_client_state:
  some stage keeps a per-client row; full_participation: every client takes
  part in every round; resident: None (resident whenever it can be and there is
  state), True (required: an error if the cohort changes) or False;
  stacks_uploads: a stage needs the cohort's uploads stacked (an attack, a
  robust rule, server clipping, audit canaries); refuses_clients: admission may refuse a drawn client (budgets);
  one_step_width: the largest client's example count where every client's
  local work is one plain SGD step whose upload only the example-weighted sum
  reads (core/one_step.py), else 0; paged: the per-client state is a host
  table whose cohort rows each round places in slot order (paged_state.py), so
  they are resident whoever the cohort is; shard_table: a table that is not
  resident is sharded over the devices (table_rows) where there are several."""
  if parallelism == "auto":
    parallelism = ("one_step" if one_step_width else "low_rank" if low_rank_rows else
                   "map" if mesh.devices.flat[0].platform == "cpu" else "vmap")
  if parallelism == "one_step" and not one_step_width:
    raise ValueError("one_step needs every client's local work to be one plain SGD step")
  if parallelism == "low_rank" and not low_rank_rows:
    raise ValueError("low_rank needs plain SGD steps on a model of dense layers")
  if resident is None:
    resident = paged or (full_participation and per_client_state)
  if resident and not (full_participation or paged):
    raise ValueError("resident_state needs every client in every round (sampling fixed, "
                     f"clients_per_round = num_clients = {num_clients})")
  local = slots // mesh.devices.size
  batch = client_batch or {"map": 1, "vmap": min(local, VMAP_GROUP),
                           "one_step": max(1, ONE_STEP_EXAMPLES // max(one_step_width, 1)),
                           "low_rank": max(1, LOW_RANK_ROWS // max(low_rank_rows, 1))
                           }[parallelism]
  return Executor(parallelism=parallelism, batch=min(batch, local),
                  resident=resident, fused_sum=not stacks_uploads,
                  # only a refused client's row must survive: the replicated table
                  # drops non-participants' writes, resident padding rows are junk
                  keep_rows=resident and refuses_clients,
                  width=one_step_width if parallelism == "one_step" else 0,
                  table_rows=table_rows(mesh, num_clients) if (
                      shard_table and per_client_state and not resident) else 0)


def table_rows(mesh: Mesh, num_clients: int) -> int:
  """Rows of a sharded per-client table on each device: device d holds clients
  d * rows ... (d + 1) * rows - 1 (the last device's tail is padding); 0 (the
  table whole) on one device. Across processes the all-to-all goes through the
  processes' collectives like the others (gloo on CPU: tests/test_processes.py;
  NCCL on GPUs not yet run)."""
  n_dev = mesh.devices.size
  if n_dev == 1:
    return 0
  return -(-num_clients // n_dev)


def sum_over_devices(tree):
  """Inside shard_map: the sum over devices of each leaf (psum's value), added in
  device order, ((d_0 + d_1) + d_2) + ..., after an all-gather.

  XLA's all-reduce within one process adds in that order; across processes (gloo
  on CPU, NCCL on GPU) it adds in the order of its ring or tree, which changed the
  last bits of a round. Gathering and adding here gives the same bits whether the
  `clients` axis is in one process or spread over many. The cost is room for
  every device's copy of the sum while it is added: [devices, *leaf], and 3-4 % of
  the FedAvg round on 2 CPU devices, so a run of one process keeps psum (whose
  order this is: the same bits)."""
  if jax.process_count() == 1:
    return jax.lax.psum(tree, "clients")

  def one(x):
    parts = jax.lax.all_gather(x, "clients", to="invarying")
    total = parts[0]
    for i in range(1, parts.shape[0]):
      total = total + parts[i]
    return total
  return jax.tree.map(one, tree)


def gather_over_devices(a: jax.Array) -> jax.Array:
  """Inside shard_map: every device's slice of `a`, concatenated along axis 0."""
  return jax.lax.all_gather(a, "clients", tiled=True, to="invarying")


def _vmap_clients(fn: Callable) -> Callable:
  """jax.vmap(fn) over a group of clients, except that a group of one calls fn on
  the client itself: vmapped, a training loop whose trip count is per client
  becomes a while loop that selects its whole carry at every step, traffic a
  single client does not need."""
  def call(*args):
    if jax.tree.leaves(args)[0].shape[0] == 1:
      out = fn(*jax.tree.map(lambda a: a[0], args))
      return jax.tree.map(lambda a: a[None], out)
    return jax.vmap(fn)(*args)
  return call


def map_in_batches(step: Callable, carry, slots, batch: int):
  """lax.scan of step(carry, chunk) over `slots` (leaves [local, ...]) in chunks of
  `batch`, the remainder as one smaller chunk; outputs stacked [local, ...]."""
  local = jax.tree.leaves(slots)[0].shape[0]
  batch = max(1, min(batch, local))
  full = local // batch * batch
  head = jax.tree.map(lambda a: a[:full].reshape((full // batch, batch) + a.shape[1:]), slots)
  carry, out = jax.lax.scan(step, carry, head)
  out = jax.tree.map(lambda a: a.reshape((full,) + a.shape[2:]), out)
  if full < local:
    carry, tail = step(carry, jax.tree.map(lambda a: a[full:], slots))
    out = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), out, tail)
  return out, carry


def _map_with_table(step: Callable, table, slots, batch: int, sums):
  """map_in_batches of step(table, chunk) -> (table, out) -> (out, table). With
  `sums` (a pytree of zeros), out is (stacked, summed) per group; the summed
  parts are added up in the loop's carry instead of being stacked, and the
  result is ((stacked outputs, sums), table)."""
  def summing_step(carry, chunk):
    table, acc = carry
    table, out = step(table, chunk)
    if sums is not None:
      out, part = out
      acc = jax.tree.map(lambda a, p: a + jnp.sum(p, axis=0), acc, part)
    return (table, acc), out

  out, (table, acc) = map_in_batches(summing_step, (table, () if sums is None else sums),
                                      slots, batch)
  return ((out, acc) if sums is not None else out), table


def _read_rows(table, start, size: int, ids=None):
  """The group's rows of the table, materialised before the table is written.
  XLA would otherwise fuse the read into every later use of the old row (SCAFFOLD's
  c_i^+ - c_i, computed after the write) and, to keep the old row for those uses,
  copy the whole table in every step of the loop: a round's cost then grew with
  the square of the clients (1.1 -> 1.4 ms a client from 1,000 to 3,000 resident,
  1.8 -> 3.4 ms replicated). An optimization_barrier does not stop it on CPU (XLA
  removes barriers before fusion); a conditional's result is a buffer of its own.
  `ids` [size]: rows to gather (else the `size` rows from `start`)."""
  def read(t):
    if ids is not None:
      return jax.tree.map(lambda a: a[ids], t)
    return jax.tree.map(lambda a: jax.lax.dynamic_slice_in_dim(a, start, size), t)
  empty = lambda t: jax.tree.map(jnp.zeros_like, read(t))   # never taken (start >= 0)
  if ids is not None:
    # a replicated table read at varying ids: made varying before the cond, not
    # inside its branches (vmapped replicas batch the predicate, and the batched
    # cond then met a pvary of an already varying table)
    table = jax.lax.pcast(table, "clients", to="varying")
  return jax.lax.cond(start >= 0, read, empty, table)


def map_clients_with_state(fn: Callable, args, client_state, read_ids: jax.Array,
                           write_ids: jax.Array, batch: int, sums=None):
  """lax.map(fn, args, batch_size=batch) for clients that read and write their row
  of the replicated per-client state; runs inside shard_map over "clients".

  fn(args_i, state_row_i) -> (outputs_i, new_state_row_i); args [local, ...];
  client_state leaves [num_clients, ...], the same on every device; read_ids
  [local]: the row each slot reads; write_ids [local]: the row it writes
  (num_clients: none). Returns (outputs stacked
  [local, ...], client_state with every device's new rows written, identical on
  all devices). The new rows are all-gathered over the devices after each batch:
  on CPU that moved 100 clients' 199,210-float rows 4x faster than one all-gather
  of the whole cohort after the loop, and the copy overlaps the training.
  With `sums` (a pytree of zeros), fn returns ((outputs_i, summed_i), row) and
  the first result is (outputs stacked, the sum of the summed_i over this
  device's slots): summed in the loop, a large per-client output (an upload)
  is never stacked."""
  def step(table, chunk):
    chunk_args, reads, writes = chunk
    rows = _read_rows(table, reads[0], reads.shape[0], reads)
    out, new_rows = _vmap_clients(fn)(chunk_args, rows)
    if jax.tree.leaves(table):
      where = gather_over_devices(writes)
      table = jax.tree.map(lambda a, r: a.at[where].set(gather_over_devices(r), mode="drop"),
                           table, new_rows)
    return table, out

  return _map_with_table(step, client_state, (args, read_ids, write_ids), batch, sums)


def map_clients_with_resident_state(fn: Callable, args, local_state, batch: int, sums=None):
  """lax.map(fn, (args, local_state), batch_size=batch) -> (outputs, new local_state):
  every slot's state row lives on the device that trains it (resident layout,
  leaves [local, ...] aligned with args), so rows are read and written in place
  of the slot, with nothing gathered or exchanged between devices. `sums` as
  in map_clients_with_state."""
  # The table is the loop's carry, each group's rows updated in place: as scanned
  # inputs and stacked outputs it cost a fresh zeroed table and a copy per round.
  def step(table, chunk):
    chunk_args, slot = chunk
    size = slot.shape[0]
    rows = _read_rows(table, slot[0], size)
    out, new_rows = _vmap_clients(fn)(chunk_args, rows)
    table = jax.tree.map(lambda a, r: jax.lax.dynamic_update_slice_in_dim(a, r, slot[0], 0),
                         table, new_rows)
    return table, out

  local = jax.tree.leaves(args)[0].shape[0]
  return _map_with_table(step, local_state, (args, jnp.arange(local)), batch, sums)


def map_clients_with_sharded_state(fn: Callable, args, local_table, read_ids: jax.Array,
                                   write_ids: jax.Array, batch: int, rows: int, sums=None):
  """map_clients_with_state for a table sharded over "clients" in blocks of ids:
  local_table leaves [rows, ...], this device's clients d * rows ... (d + 1) *
  rows - 1. Every slot's row is fetched before the loop, in one exchange
  (_fetch_rows: an exchange per group of clients made the round 1.7x the
  replicated table's on 2 CPU devices, each collective a synchronisation); the
  new rows are all-gathered after each group, as with the replicated table, and
  each device writes the ones it owns. A real client is in a cohort once, so no
  slot reads a row the round wrote: the same rows are read and written as from a
  replicated table, and the numbers are the same bits. A device holds 1 / devices
  of the table, and its slots' rows (a [local, ...] page) for the round."""
  page = _fetch_rows(local_table, read_ids, rows)

  def step(table, chunk):
    chunk_args, slot, writes = chunk
    out, new_rows = _vmap_clients(fn)(chunk_args, jax.tree.map(
        lambda a: jax.lax.dynamic_slice_in_dim(a, slot[0], slot.shape[0]), page))
    if jax.tree.leaves(table):
      local = _owned_index(gather_over_devices(writes), rows)
      table = jax.tree.map(lambda a, r: a.at[local].set(gather_over_devices(r), mode="drop"),
                           table, new_rows)
    return table, out

  local = read_ids.shape[0]
  return _map_with_table(step, local_table, (args, jnp.arange(local), write_ids), batch, sums)


def _owned_index(ids: jax.Array, rows: int) -> jax.Array:
  """Each id's row in this device's block, or `rows` (out of range) where another
  device holds it or the id is padding's."""
  local = ids - jax.lax.axis_index("clients") * rows
  return jnp.where((local >= 0) & (local < rows), local, rows)


def _fetch_rows(table, reads: jax.Array, rows: int):
  """The rows `reads` [group] name, from a table sharded in blocks of `rows` ids
  -> leaves [group, ...]. Every device serves its own rows of every device's
  reads (zeros for the others) and an all-to-all hands each reader the block its
  rows' owners served; the reader picks its row from the owner's block. The
  exchange holds [devices * group, ...] rows on each device while it runs."""
  asked = gather_over_devices(reads)                  # [devices * group]
  n_dev, group = asked.shape[0] // reads.shape[0], reads.shape[0]
  local = _owned_index(asked, rows)
  owned = local < rows

  def serve(a):
    got = a[jnp.minimum(local, rows - 1)]
    got = jnp.where(owned.reshape((-1,) + (1,) * (a.ndim - 1)), got, jnp.zeros_like(got))
    # [reader, group, ...] -> [owner, group, ...]: block j comes from device j
    got = jax.lax.all_to_all(got.reshape((n_dev, group) + a.shape[1:]), "clients", 0, 0)
    return got[reads // rows, jnp.arange(group)]
  return jax.tree.map(serve, table)
