"""Per-client state outside device memory: a host table paged onto the devices.

With `client_state_store: host` or `disk` the per-client state (SCAFFOLD's
control variates, TopkSDP-FL's residuals, MOON's previous models, ...) does not
live on the device as a dense `[num_clients, ...]` table. It lives in a
`HostTable` (numpy arrays in host memory, or files on disk read and written by row,
stored float32 or bfloat16), and each round runs as a page (`run_pages`):

  1. the round's cohort is drawn ahead, with the round's own key and sampler
     (the same ids, dealt to the same slots, that the compiled round draws);
  2. the cohort's rows are gathered from the table in slot order and placed
     sharded over the "clients" axis, so each device holds the rows of the
     clients it trains (the executor's resident layout: no row crosses devices);
  3. the compiled round reads and writes them in place;
  4. the rows of the clients drawn are scattered back into the table.

Device memory is then set by the cohort, not the population. Stored float32 the
results are bit for bit those of the device table (tests/test_paged_state.py);
bfloat16 halves the table and rounds each row to 8 bits of mantissa whenever
it is stored.

Rows nobody has written yet read as round 0's row, so a table of a million
clients costs nothing until clients take part (no table-sized initialisation).
A disk table's files are unlinked as soon as they are opened: they take disk
space while the table lives and vanish with it, even if the process is killed.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import weakref
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
TABLE_META = "table.json"   # a saved table's shapes, dtypes and files' SHA-256 (HostTable.save)


class HostTable:
  """Every client's state rows off the device: one [num_clients, row size] array per
  leaf of the per-client pytree, in host memory ('host') or in files ('disk',
  under `directory`; FileRows). Float32 leaves are stored as `dtype`
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
    return FileRows(shape, dtype, directory or tempfile.gettempdir())

  @property
  def nbytes(self) -> int:
    """Bytes the whole table takes once every client has been written."""
    return sum(t.nbytes for t in self.tables)

  def gather(self, ids) -> Any:
    """The rows of clients `ids` [n] as a per-client pytree of float32 (or the
    leaf's own dtype) numpy arrays [n, ...]; unwritten clients read round 0's row."""
    ids = np.asarray(ids)
    fresh = ~self.written[ids]
    out = []
    for table, init, shape, dtype in zip(self.tables, self.init, self.shapes, self.dtypes):
      rows = np.empty((len(ids), init.size), dtype)
      rows[fresh] = init
      rows[~fresh] = table[ids[~fresh]]   # only written rows are read
      out.append(rows.reshape((len(ids),) + shape))
    return jax.tree.unflatten(self.treedef, out)

  def scatter(self, ids, rows: Any) -> None:
    """Writes rows (a pytree as `gather` returns, [len(ids), ...]) as clients `ids`'."""
    ids = np.asarray(ids)
    for table, leaf in zip(self.tables, self.treedef.flatten_up_to(rows)):
      table[ids] = np.asarray(leaf).reshape(len(ids), -1).astype(table.dtype)
    self.written[ids] = True

  # ------------------------------------------------------------ checkpoints

  def save(self, directory: str, chunk: int = 4096) -> None:
    """Writes the written clients' rows to `directory` (made here): ids.npy, one
    raw file of rows per leaf (stored dtype, [written, row size]) and table.json
    with the shapes, dtypes and each file's SHA-256. Rows go in chunks of `chunk`
    clients, so a disk table is never read whole into memory."""
    os.makedirs(directory)
    ids = np.flatnonzero(self.written)
    np.save(os.path.join(directory, "ids.npy"), ids)
    digests = []
    for k, table in enumerate(self.tables):
      h = hashlib.sha256()
      with open(os.path.join(directory, f"leaf{k}.bin"), "wb") as f:
        for lo in range(0, len(ids), chunk):
          rows = np.ascontiguousarray(table[ids[lo:lo + chunk]]).view(np.uint8)
          h.update(rows)
          f.write(rows)
        f.flush()
        os.fsync(f.fileno())
      digests.append(h.hexdigest())
    with open(os.path.join(directory, TABLE_META), "w") as f:
      json.dump({"num_clients": self.num_clients, "dtype": self.dtype, "written": len(ids),
                 "leaves": [{"row": int(t.shape[1]), "stored": np.dtype(t.dtype).name,
                             "sha256": d} for t, d in zip(self.tables, digests)]}, f)

  def load(self, directory: str, chunk: int = 4096) -> None:
    """Replaces the rows with those `save` wrote to `directory`. ValueError where
    they do not fit this table or their bytes changed; the table then holds no
    written rows (every client reads round 0's row), so an older checkpoint can
    be loaded into it next."""
    self.written[:] = False
    with open(os.path.join(directory, TABLE_META)) as f:
      meta = json.load(f)
    mine = [(int(t.shape[1]), np.dtype(t.dtype).name) for t in self.tables]
    theirs = [(leaf["row"], leaf["stored"]) for leaf in meta["leaves"]]
    if meta["num_clients"] != self.num_clients or theirs != mine:
      raise ValueError(f"its client table ({meta['num_clients']} clients, rows {theirs}) "
                       f"is not this run's ({self.num_clients} clients, rows {mine})")
    ids = np.load(os.path.join(directory, "ids.npy"))
    if len(ids) != meta["written"]:
      raise ValueError("its client table's ids do not match its table.json")
    for k, (table, leaf) in enumerate(zip(self.tables, meta["leaves"])):
      h = hashlib.sha256()
      row_bytes = table.shape[1] * np.dtype(table.dtype).itemsize
      with open(os.path.join(directory, f"leaf{k}.bin"), "rb") as f:
        for lo in range(0, len(ids), chunk):
          part = ids[lo:lo + chunk]
          raw = np.frombuffer(f.read(len(part) * row_bytes), np.uint8)
          if raw.size != len(part) * row_bytes:
            raise ValueError(f"its client table file leaf{k}.bin is truncated")
          h.update(raw)
          table[part] = raw.reshape(len(part), -1).view(table.dtype)
      if h.hexdigest() != leaf["sha256"]:
        raise ValueError(f"its client table file leaf{k}.bin does not match its digest")
    self.written[ids] = True


def checkpoint_side(state):
  """(save, restore) for checkpoint.save's and restore_latest's `side` when the
  state's per-client rows are a HostTable (which orbax does not see), else (None, None)."""
  table = getattr(state, "client_state", None)
  if not isinstance(table, HostTable):
    return None, None

  def restore(folder: str, restored):
    restored.client_state.load(folder)   # the template's table, refilled
    return restored
  return table.save, restore


class FileRows:
  """A [rows, size] array in a file, read and written a row at a time with
  pread/pwrite: `a[ids]` and `a[ids] = values` as for a numpy array. Writing
  through a memory map instead cost 4-9 s for 1,000 rows of 195 KB (a page fault
  for each 4 KB of a new row), pwrite 0.07 s. The file is unlinked at once:
  it takes disk space while this object lives and never outlives the process.
  Its blocks are allocated as rows are first written (a sparse file)."""

  def __init__(self, shape, dtype, directory: str):
    self.shape, self.dtype = tuple(shape), np.dtype(dtype)
    self.row_bytes = shape[1] * self.dtype.itemsize
    self.nbytes = shape[0] * self.row_bytes
    fd, path = tempfile.mkstemp(prefix="client_state-", suffix=".bin", dir=directory)
    os.unlink(path)
    os.ftruncate(fd, self.nbytes)
    self.fd = fd
    weakref.finalize(self, os.close, fd)

  def __getitem__(self, ids) -> np.ndarray:
    out = np.empty((len(ids), self.row_bytes), np.uint8)   # bytes: bfloat16 has no buffer
    for row, i in zip(out, ids):
      os.preadv(self.fd, [row], int(i) * self.row_bytes)
    return out.view(self.dtype)

  def __setitem__(self, ids, values) -> None:
    values = np.ascontiguousarray(values, self.dtype).reshape(len(ids), -1).view(np.uint8)
    for row, i in zip(values, ids):
      os.pwrite(self.fd, row, int(i) * self.row_bytes)


# A leafless pytree node: a SimState holding a HostTable can be placed, mapped and
# printed as any other; jit never sees it (run_pages swaps in the round's rows).
jax.tree_util.register_pytree_node(HostTable, lambda t: ((), t), lambda t, _: t)


class Paging(NamedTuple):
  """How a simulation whose per-client state is a HostTable runs (make_paging)."""
  draw_cohort: Any     # (key, round, client_count) -> ids, mask [slots]
  make_table: Any      # round 0's row of one client -> HostTable
  slots: Any           # NamedSharding: the cohort's rows over the "clients" axis


def make_paging(round_cohort, mesh, num_clients: int, *, kind: str, dtype: str,
                directory: str | None) -> Paging:
  """round_cohort(key, round, client_count) -> (ids, mask) [slots]: the cohort the
  compiled round draws, whose rows are gathered ahead of it."""
  make_table = partial(HostTable, num_clients=num_clients, kind=kind, dtype=dtype,
                       directory=directory)
  return Paging(jax.jit(round_cohort), make_table, NamedSharding(mesh, P("clients")))


def run_pages(paging: Paging, run_chunk, state, num_rounds: int, client_count):
  """run_chunk(state, 1) -> (state, stats [1]) for a state whose client_state is a
  HostTable, round by round with the round's cohort's rows on the devices in
  slot order. Returns the state (holding the same, updated, table) and the
  stats of the num_rounds rounds."""
  table, chunks = state.client_state, []
  for _ in range(num_rounds):
    ids, mask = (np.asarray(a) for a in paging.draw_cohort(state.key, state.round,
                                                           client_count))
    page = jax.device_put(table.gather(ids), paging.slots)
    state, stats = run_chunk(state._replace(client_state=page), 1)
    rows = jax.device_get(state.client_state)
    # each drawn client has one slot; padded slots (mask False) write nothing
    table.scatter(ids[mask], jax.tree.map(lambda a: a[mask], rows))
    state = state._replace(client_state=table)
    chunks.append(stats)
  return state, jax.tree.map(lambda *a: jnp.concatenate(a), *chunks)
