"""fedjax-dp profile: the trace and its operation table, read back independently."""

import collections
import csv
import glob
import gzip
import json
import os
import subprocess
import sys

import pytest

import fedjax_dp
from fedjax_dp.experiment import profile

FAST = {"dataset": "digits", "num_clients": 8, "clients_per_round": 4, "hidden": [16],
        "batch_size": 16, "local_epochs": 1, "devices": 1}


def json_trace_times(out):
  """{hlo_op: (total us, self us)} from the Perfetto trace (trace.json.gz), a second
  reading of the same trace: self time by interval nesting per thread."""
  path = glob.glob(os.path.join(out, "plugins", "profile", "*", "*.trace.json.gz"))[0]
  with gzip.open(path) as f:
    events = [e for e in json.load(f)["traceEvents"]
              if e.get("ph") == "X" and "hlo_op" in e.get("args", {})]
  total, own = collections.Counter(), collections.Counter()
  by_thread = collections.defaultdict(list)
  for e in events:
    by_thread[(e["pid"], e["tid"])].append(e)
  for evs in by_thread.values():
    evs.sort(key=lambda e: (e["ts"], -e["dur"]))
    for i, e in enumerate(evs):
      name = e["args"]["hlo_op"]
      total[name] += e["dur"]
      own[name] += e["dur"]
      # the innermost earlier event that still encloses this one is its parent
      for parent in reversed(evs[:i]):
        if parent["ts"] + parent["dur"] > e["ts"]:
          own[parent["args"]["hlo_op"]] -= e["dur"]
          break
  return total, own


def test_the_op_table_agrees_with_the_perfetto_trace(tmp_path):
  out = str(tmp_path / "p")
  result = fedjax_dp.profile("fedavg", out=out, rounds=3, **FAST)
  total, own = json_trace_times(out)
  with open(os.path.join(out, "ops.csv"), newline="") as f:
    rows = {r["op"]: r for r in csv.DictReader(f)}
  assert set(rows) == set(total)
  for op, us in total.items():
    assert float(rows[op]["total_ms"]) == pytest.approx(us / 1e3, rel=1e-6, abs=1e-6)
    assert float(rows[op]["self_ms"]) == pytest.approx(max(own[op], 0) / 1e3, rel=1e-6,
                                                       abs=1e-3)
  shares = [r["share"] for r in result["rows"]]
  assert sum(shares) == pytest.approx(1.0) and shares == sorted(shares, reverse=True)
  # the local training's matmuls are there, named by the JAX path that made them
  assert any("dot_general" in r["source"] and "MLP" in r["source"] for r in result["rows"])
  with open(os.path.join(out, "profile.json")) as f:
    summary = json.load(f)
  assert summary["rounds"] == 3 and summary["config"]["hidden"] == [16]
  assert any(p.endswith(".xplane.pb") for p in summary["trace_files"])


def test_op_sources_reads_the_metadata_op_name():
  text = ('  %dot.10 = f32[16,200]{1,0} dot(%a, %b), metadata={op_name="jit(run_chunk)/while/'
          'body/closed_call/shard_map/while/body/closed_call/transpose(jvp(MLP))/Dense_1/'
          'dot_general" stack_frame_id=5}\n'
          '  ROOT %add.3 = s32[] add(%x, %y), metadata={op_name="add"}\n'
          '  %p = f32[] parameter(0)\n')
  assert profile.op_sources(text) == {
      "dot.10": "shard_map/transpose(jvp(MLP))/Dense_1/dot_general", "add.3": "add"}


def cli(*args, cwd=None):
  exe = os.path.join(os.path.dirname(sys.executable), "fedjax-dp")
  return subprocess.run([exe, "profile", *args], capture_output=True, text=True, timeout=600,
                        cwd=cwd)


def test_cli_prints_the_top_operations_and_where_the_trace_is(tmp_path):
  sets = [f"{k}={json.dumps(v)}" for k, v in FAST.items()]
  done = cli("--set", *sets, "--rounds", "2", "--top", "5", "--out", str(tmp_path / "p"))
  assert done.returncode == 0, done.stderr
  lines = done.stdout.splitlines()
  assert lines[0].startswith("2 rounds in ") and "the top 5 of " in lines[0]
  assert lines[1].split()[:2] == ["share", "self"] and len(lines[2:7]) == 5
  trace = next(l for l in lines if l.startswith("trace:"))
  assert os.path.isfile(trace.split()[1])


@pytest.mark.parametrize("args, fragment", [
    (["--rounds", "0", "--out", "p"], "argument --rounds: '0': allowed are whole numbers >= 1"),
    (["--out", "full"], "--out full: exists and is not an empty folder"),
    ([], "--out is required"),
    (["--set", "lr=-1", "--out", "p"], "config key 'lr' = -1"),
])
def test_cli_errors_are_one_line_with_exit_status_2(tmp_path, args, fragment):
  (tmp_path / "full").mkdir()
  (tmp_path / "full" / "x").write_text("keep")
  done = cli(*args, cwd=tmp_path)
  assert done.returncode == 2, done
  assert done.stderr.count("\n") == 1 and fragment in done.stderr, done.stderr
  assert not (tmp_path / "p").exists() and (tmp_path / "full" / "x").read_text() == "keep"
