"""Many processes: `fedjax-dp run --num-processes N` on loopback reproduces one process.

The reference is one process with 4 CPU devices; the runs under test spread the
same 4-device `clients` axis over 2 processes (2 devices each) and 4 processes
(1 each), talking through gloo on 127.0.0.1. Metrics, the privacy report and
every checkpoint's state digest must be the same bits, and only process 0 may
write or print.
"""

import json
import os
import re
import socket
import subprocess
import sys

import pytest

from fedjax_dp.cli import main

# local DP (per-client ledgers and budgets, sharded over every process's devices),
# Poisson cohorts, a robust rule (it gathers the uploads), FedDyn's per-client table
# (sharded in blocks of ids: rows cross processes in the all-to-all), checkpoints
RUN = ["dataset=synthetic", "num_clients=18", "clients_per_round=8", "sampling=poisson",
       "max_cohort=12", "rounds=4", "eval_every=2", "checkpoint_every=2", "dp=local",
       "noise_multiplier=1.0", "target_epsilon=30", "aggregator=trimmed_mean",
       "algorithm=feddyn"]
DEVICES = 4


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(out: str, processes: int, sets=RUN, extra=()) -> list[subprocess.CompletedProcess]:
  """Runs the command in `processes` processes (DEVICES // processes CPU devices each)."""
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  env["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count={DEVICES // processes} "
                      "--xla_backend_optimization_level=0")
  cmd = [sys.executable, "-m", "fedjax_dp.cli", "run", "--no-progress", "--out", out]
  for kv in sets:
    cmd += ["--set", kv]
  cmd += list(extra)
  if processes > 1:
    cmd += ["--num-processes", str(processes), "--coordinator", f"127.0.0.1:{_free_port()}"]
  procs = [subprocess.Popen(cmd + (["--process-id", str(i)] if processes > 1 else []), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(processes)]
  done = []
  for p in procs:
    stdout, stderr = p.communicate(timeout=300)
    done.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
  for i, d in enumerate(done):
    assert d.returncode == 0, (i, d.stderr[-2000:])
  return done


def _outputs(out: str) -> dict:
  """What a run released, less wall-clock times."""
  rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
  for r in rows:
    r.pop("wall_s")
  with open(os.path.join(out, "summary.json")) as f:
    summary = json.load(f)
  summary["final"].pop("wall_s")
  steps = sorted(int(s) for s in os.listdir(os.path.join(out, "checkpoints")))
  digests = {}
  for s in steps:
    with open(os.path.join(out, "checkpoints", str(s), "meta", "metadata")) as f:
      digests[s] = json.load(f)["state_sha256"]
  return {"rows": rows, "privacy": summary["privacy"], "final": summary["final"],
          "digests": digests, "files": sorted(os.listdir(out))}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("one") / "run")
  _launch(out, 1)
  return _outputs(out)


# 25 s with the one-process run they compare to: `make test-slow` (CI runs it)
@pytest.mark.slow
@pytest.mark.parametrize("processes", [2, 4])
def test_many_processes_release_what_one_process_releases(processes, one_process, tmp_path):
  out = str(tmp_path / "run")
  runs = _launch(out, processes)
  got = _outputs(out)
  assert list(got["digests"]) == [2, 4]
  assert got == one_process
  assert "test accuracy" in runs[0].stdout
  for r in runs[1:]:   # process 0 speaks for the run (gloo's own connection lines aside)
    assert [line for line in r.stdout.splitlines() if not _gloo_says(line)] == []


def _gloo_says(line: str) -> bool:
  """gloo's connection report, '[Gloo] Rank 3 is connected to 3 peer ranks. ...'; its
  writes can reach the pipe split ('[Gloo] Rank ' and '3 is connected ...' on two lines)."""
  return line.startswith("[Gloo]") or re.match(r"\d+ is connected to \d+ peer ranks", line)


@pytest.mark.slow
def test_a_run_of_two_processes_resumes_to_the_uninterrupted_numbers(one_process, tmp_path):
  out = str(tmp_path / "run")
  _launch(out, 2, [kv for kv in RUN if not kv.startswith("rounds=")] + ["rounds=2"])
  _launch(out, 2, extra=["--resume"])
  assert _outputs(out) == one_process


@pytest.mark.parametrize("argv, message", [
    (["--num-processes", "2", "--process-id", "2", "--coordinator", "127.0.0.1:1"],
     "--process-id 2: with --num-processes 2, expected 0 to 1"),
    (["--num-processes", "2", "--process-id", "0", "--coordinator", "localhost"],
     "--coordinator 'localhost': expected HOST:PORT"),
    (["--process-id", "1"], "--process-id 1 / --coordinator None: these need --num-processes"),
    (["--num-processes", "0"], "--num-processes 0: expected 1 or more"),
])
def test_bad_process_flags_are_one_line_errors(argv, message, tmp_path, capsys):
  out = tmp_path / "run"
  assert main(["run", "--out", str(out), "--set", "dataset=synthetic", *argv]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and message in err and err.count("\n") == 1
  assert not out.exists()


def test_start_processes_after_jax_started_is_a_one_line_error():
  import jax.numpy as jnp
  import fedjax_dp
  jnp.zeros(1).block_until_ready()   # JAX has started its backends
  with pytest.raises(fedjax_dp.RunError, match=r"^start_processes: .*before") as e:
    fedjax_dp.start_processes(2, 0, "127.0.0.1:1")
  assert "\n" not in str(e.value)
  assert fedjax_dp.start_processes(1) == 1   # alone: nothing to join
