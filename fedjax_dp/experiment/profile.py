"""`fedjax-dp profile`: a jax.profiler trace of N compiled rounds and their top operations.

    fedjax-dp profile --config experiments/demo.yaml --rounds 5 --out runs/profile

The config's simulation is built and its chunk of N rounds compiled and run once
untraced (so the trace holds no compilation), then run again under
`jax.profiler.trace(out)`. The trace (out/plugins/profile/<run>/*.xplane.pb and
*.trace.json.gz) opens in Perfetto (ui.perfetto.dev: open the .trace.json.gz)
and in TensorBoard's profile plugin (tensorboard --logdir out). The command
prints the operations that took the most time: each compiled operation (an XLA
HLO op: a fusion, a dot, a sort, a loop) summed over its executions, its self
time (a loop's own, without the ops of its body), its share of all operations'
self time and the JAX path that made it (its metadata's op_name: functions,
flax modules, primitive: 'shard_map/transpose(jvp(MLP))/Dense_1/dot_general'
is the backward matmul of the MLP's second layer in the clients' phase). It also
writes ops.csv (every operation) and profile.json (the rounds, their wall time,
and the trace's files).

On CPU the operations run on XLA's worker threads, so shares are of the time
summed over threads (an op a loop hands to another thread stays inside the
loop's self time); on a GPU, of the device's time.
"""

from __future__ import annotations

import glob
import os
import re
import time

from fedjax_dp.experiment import reporting
from fedjax_dp.errors import RunError

# an HLO instruction of the compiled module's text, and its metadata's op_name
_INSTRUCTION = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*?metadata=\{op_name="([^"]*)"')
# the nesting every op inside a compiled chunk's loops repeats
_BOILERPLATE = re.compile(r"(jit\([\w.]+\)/)|((while|cond)/body/closed_call/)|(closed_call/)")


def op_sources(hlo_text: str) -> dict[str, str]:
  """{HLO instruction name: the JAX path that made it} from a compiled module's text
  (its metadata's op_name: the functions, flax modules and primitive, e.g.
  'shard_map/transpose(jvp(MLP))/Dense_1/dot_general'; the chunk's loop nesting left out)."""
  out = {}
  for line in hlo_text.splitlines():
    m = _INSTRUCTION.match(line)
    if m:
      out[m.group(1)] = _BOILERPLATE.sub("", m.group(2)) or m.group(2)
  return out


def op_times(xplane_path: str) -> dict[str, dict]:
  """{HLO op: {'module', 'count', 'total_ns', 'self_ns'}} from a trace: the events
  that carry an `hlo_op` statistic, on the device planes if any has them, else on
  the host's. self_ns leaves out the ops nested inside (a loop's body on the same
  thread), so that self times add up to the busy time."""
  from jax.profiler import ProfileData
  data = ProfileData.from_file(xplane_path)
  per_plane = {}
  for plane in data.planes:
    ops: dict[str, dict] = {}
    lines = list(plane.lines)
    if any(line.name == "XLA Ops" for line in lines):   # a GPU's: its streams repeat them
      lines = [line for line in lines if line.name == "XLA Ops"]
    for line in lines:
      stack: list[list] = []   # [end_ns, name] of the enclosing ops on this thread
      for event in sorted(line.events, key=lambda e: (e.start_ns, -e.duration_ns)):
        stats = dict(event.stats)
        name = stats.get("hlo_op")
        if not name:
          continue
        while stack and stack[-1][0] <= event.start_ns:
          stack.pop()
        if stack:
          ops[stack[-1][1]]["self_ns"] -= float(event.duration_ns)
        entry = ops.setdefault(name, {"module": stats.get("hlo_module", ""), "count": 0,
                                      "total_ns": 0.0, "self_ns": 0.0})
        entry["count"] += 1
        entry["total_ns"] += float(event.duration_ns)
        entry["self_ns"] += float(event.duration_ns)
        stack.append([event.start_ns + event.duration_ns, name])
    if ops:
      per_plane[plane.name] = ops
  devices = {k: v for k, v in per_plane.items() if k.startswith("/device:")}
  merged: dict[str, dict] = {}
  for ops in (devices or per_plane).values():
    for name, e in ops.items():
      m = merged.setdefault(name, {"module": e["module"], "count": 0, "total_ns": 0.0,
                                   "self_ns": 0.0})
      for k in ("count", "total_ns", "self_ns"):
        m[k] += e[k]
  return merged


def top_rows(ops: dict[str, dict], sources: dict[str, str]) -> list[dict]:
  """Every op, most self time first: name, module, count, self and total ms, mean
  self us, share of all self time, and the JAX path that made it."""
  busy = sum(max(e["self_ns"], 0.0) for e in ops.values()) or 1.0
  rows = [{"op": name, "module": e["module"], "count": e["count"],
           "self_ms": max(e["self_ns"], 0.0) / 1e6, "total_ms": e["total_ns"] / 1e6,
           "mean_us": max(e["self_ns"], 0.0) / e["count"] / 1e3,
           "share": max(e["self_ns"], 0.0) / busy, "source": sources.get(name, "")}
          for name, e in ops.items()]
  return sorted(rows, key=lambda r: -r["self_ms"])


def format_top(rows: list[dict], top: int) -> str:
  lines = [f"{'share':>6}  {'self ms':>8}  {'count':>6}  {'mean us':>8}  op: JAX path"]
  for r in rows[:top]:
    lines.append(f"{100 * r['share']:5.1f}%  {r['self_ms']:8.2f}  {r['count']:6d}  "
                 f"{r['mean_us']:8.1f}  {r['op']}: {r['source'][:140]}")
  return "\n".join(lines)


def check_out(out: str) -> None:
  if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
    raise RunError(f"--out {out}: exists and is not an empty folder; a profile never "
                   "overwrites: name a new folder")


def profile_rounds(cfg, rounds: int, out: str, *, model=None, data=None, task=None) -> dict:
  """Builds cfg's simulation (with your model, data and loss, if given), compiles
  and runs a chunk of `rounds` rounds, runs it again under the profiler into
  `out`; returns profile.json's contents plus 'rows' (top_rows)."""
  import jax
  from fedjax_dp.experiment.setup import setup
  check_out(out)
  _, _, sim = setup(cfg, data, model=model, task=task)
  state = sim.to_working(sim.init_state())
  t = time.perf_counter()
  state, _ = sim.run_working(state, rounds)   # compiles this chunk length
  jax.block_until_ready(state)
  first = time.perf_counter() - t
  os.makedirs(out, exist_ok=True)
  with jax.profiler.trace(out):
    t = time.perf_counter()
    state, _ = sim.run_working(state, rounds)
    jax.block_until_ready(state)
    traced = time.perf_counter() - t
  planes = glob.glob(os.path.join(out, "plugins", "profile", "*", "*.xplane.pb"))
  if not planes:
    raise RunError(f"the profiler wrote no trace into {out}")
  sources = {}
  try:   # the compiled chunk's text names each op's source (a paged run has no one chunk)
    hp = sim.hparams
    sources = op_sources(sim.run_chunk.lower(state, sim.store, hp, rounds).compile().as_text())
  except Exception:   # noqa: BLE001 - the table is still right without sources
    pass
  rows = top_rows(op_times(planes[0]), sources)
  traces = sorted(glob.glob(os.path.join(out, "plugins", "profile", "*", "*")))
  summary = {"rounds": rounds, "first_chunk_s": round(first, 4), "traced_chunk_s":
             round(traced, 4), "seconds_per_round": round(traced / rounds, 6),
             "devices": int(sim.mesh.devices.size),
             "platform": sim.mesh.devices.flat[0].platform, "ops": len(rows),
             "trace_files": traces, "config": cfg.to_dict()}
  reporting.write_text_atomic(os.path.join(out, "ops.csv"), reporting.csv_text(rows)
                              if rows else "op\n")
  reporting.write_json_atomic(os.path.join(out, "profile.json"), summary)
  return {**summary, "rows": rows}
