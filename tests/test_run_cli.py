"""End-to-end runs through the CLI: outputs, determinism, refusal to overwrite, kill and resume."""

import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from fedjax_dp.experiment import checkpoint
from fedjax_dp.cli import main
from fedjax_dp.experiment.reporting import METRIC_KEYS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FAST = ["dataset=digits", "num_clients=10", "clients_per_round=5", "hidden=[32]",
        "batch_size=16", "lr=0.05", "rounds=6", "eval_every=2", "devices=1"]


def cli(args, capsys=None):
  argv = ["run", "--no-progress"] + args
  return main(argv)


def sets(*extra):
  out = []
  for kv in FAST + list(extra):
    out += ["--set", kv]
  return out


def read_rows(out):
  with open(os.path.join(out, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_run_writes_every_output(tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)
  out = "run"   # relative: the printed paths must still be absolute ones that exist
  assert cli(["--out", out] + sets()) == 0
  printed = capsys.readouterr().out
  for prefix in ("results: ", "plots:   "):
    line = next(l for l in printed.splitlines() if l.startswith(prefix))
    paths = line[len(prefix):].split(", ")
    assert paths and all(os.path.isabs(p) and os.path.isfile(p) for p in paths), line
  rows = read_rows(out)
  assert [r["round"] for r in rows] == [2, 4, 6]
  for r in rows:
    assert set(METRIC_KEYS) <= set(r)
    assert r["epsilon"] is None and 0.0 <= r["test_accuracy"] <= 1.0
  with open(os.path.join(out, "summary.json")) as f:
    summary = json.load(f)
  with open(os.path.join(out, "config.json")) as f:
    cfg = json.load(f)
  assert cfg["num_clients"] == 10 and cfg["hidden"] == [32]
  d = summary["model"]["params"]
  assert d == 64 * 32 + 32 + 32 * 10 + 10  # digits: 8x8 inputs, 10 classes
  # fixed cohort of 5 for 6 rounds, dense float32 both ways
  assert rows[-1]["bytes_up"] == rows[-1]["bytes_down"] == 6 * 5 * 4 * d
  assert summary["final"] == rows[-1]
  for png in ("accuracy.png", "loss.png", "bytes.png"):
    assert os.path.getsize(os.path.join(out, png)) > 1000


def test_same_seed_same_numbers_other_seed_other_numbers(tmp_path):
  runs = {}
  for name, seed in (("a", 0), ("b", 0), ("c", 1)):
    out = str(tmp_path / name)
    assert cli(["--out", out] + sets(f"seed={seed}")) == 0
    runs[name] = [(r["test_accuracy"], r["test_loss"], r["train_loss"]) for r in read_rows(out)]
  assert runs["a"] == runs["b"]
  assert runs["a"] != runs["c"]


def test_existing_results_are_never_overwritten(tmp_path, capsys):
  out = str(tmp_path / "run")
  assert cli(["--out", out] + sets()) == 0
  before = open(os.path.join(out, "metrics.jsonl")).read()
  capsys.readouterr()
  assert cli(["--out", out] + sets("seed=3")) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: output folder") and "--overwrite" in err and "\n" not in err
  assert open(os.path.join(out, "metrics.jsonl")).read() == before
  assert cli(["--out", out, "--resume"] + sets("seed=3")) == 2   # config must match
  assert "differs" in capsys.readouterr().err
  assert cli(["--out", out, "--overwrite"] + sets("seed=3")) == 0


def test_overwrite_and_resume_refuse_what_is_not_a_run(tmp_path, capsys, monkeypatch):
  def refused(args, words):
    capsys.readouterr()
    assert cli(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and all(w in err for w in words), err

  notes = tmp_path / "notes"
  notes.mkdir()
  (notes / "notes.txt").write_text("keep me")
  refused(["--out", str(notes), "--overwrite"] + sets(), ["holds no run", "refusing"])
  assert (notes / "notes.txt").read_text() == "keep me"
  monkeypatch.chdir(notes)
  (notes / "config.json").write_text("{}")
  refused(["--out", ".", "--overwrite"] + sets(), ["working folder"])
  assert (notes / "notes.txt").read_text() == "keep me"
  afile = tmp_path / "afile"
  afile.write_text("x")
  refused(["--out", str(afile), "--overwrite"] + sets(), ["is a file"])
  refused(["--out", str(afile / "sub")] + sets(), ["is a file, so the folder cannot be made"])
  refused(["--out", str(tmp_path / "r2")] + sets("devices=1000"), ["'devices' = 1000", "allowed"])
  refused(["--out", str(tmp_path / "r3"), "--config", str(tmp_path)] + sets(), ["is a folder"])
  (tmp_path / "latin1.yaml").write_bytes(b"rounds: 3 # \xe9\xff\n")
  refused(["--out", str(tmp_path / "r4"), "--config", str(tmp_path / "latin1.yaml")] + sets(),
          ["not UTF-8"])
  refused(["--out", str(tmp_path / "r5")] + sets("dp=central", "noise_multiplier=1e-300"),
          ["'noise_multiplier' = 1e-300", ">= 1e-06"])
  # a run whose config.json is damaged, or asked to end before where it already is
  out = str(tmp_path / "run")
  assert cli(["--out", out] + sets()) == 0
  before = open(os.path.join(out, "metrics.jsonl")).read()
  good = open(os.path.join(out, "config.json")).read()
  for damaged in ("[]", "{not json"):
    open(os.path.join(out, "config.json"), "w").write(damaged)
    refused(["--out", out, "--resume"] + sets(), ["not a valid run config"])
  open(os.path.join(out, "config.json"), "w").write(good)
  refused(["--out", out, "--resume"] + sets("rounds=4"), ["rounds = 4", "has done 6"])
  done = str(tmp_path / "done")   # checkpointed to the end: resuming has nothing to do
  assert cli(["--out", done] + sets("checkpoint_every=3")) == 0
  summary = open(os.path.join(done, "summary.json")).read()
  capsys.readouterr()
  assert cli(["--out", done, "--resume"] + sets("checkpoint_every=3")) == 0
  assert "nothing to do" in capsys.readouterr().err
  assert open(os.path.join(done, "summary.json")).read() == summary
  assert open(os.path.join(out, "metrics.jsonl")).read() == before
  assert open(os.path.join(out, "config.json")).read() == good


def test_missing_dataset_is_a_one_line_error(tmp_path, capsys, monkeypatch):
  monkeypatch.setenv("FEDJAX_DP_DATA", str(tmp_path / "nothing"))
  assert cli(["--out", str(tmp_path / "r")] + sets("dataset=cifar10")) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "cifar10" in err and "\n" not in err


@pytest.mark.parametrize("extra,message", [
    # found by an audit: accepted, and the run reported epsilon 0.0
    (["dp=central", "noise_multiplier=1.0", "delta=0.3"],
     "error: config key 'delta' = 0.3 with dp 'central': must be < 1 / num_clients = 0.1 (a "
     "delta that large allows publishing a client's data outright)"),
    # found by an audit: bytes of a sparse upload, epsilon of a dense noised vector
    (["dp=local", "noise_multiplier=1.0", "s_local=0.9"],
     "error: config key 'index_selection' = 'topk' with dp 'local' and s_local 0.9: the top-k "
     "positions come from the private update and are sent unnoised, outside the local "
     "guarantee; use random_k or public_topk"),
    # found by an audit: the kept-noise guarantee reported as complete (epsilon 4.73)
    (["algorithm=scaffold", "s_local=0.9", "kept_noise=multiplier", "kept_noise_multiplier=4.0",
      "final_clip_l2=1.0", "index_selection=random_k"],
     "error: config key 'kept_noise' = 'multiplier' with algorithm 'scaffold': SCAFFOLD's "
     "control-variate update c_i' - c_i is built from the raw, unclipped update and reaches the "
     "server unnoised, so no kept-noise guarantee would hold"),
])
def test_audit_refusals_exit_two_with_one_line(tmp_path, capsys, extra, message):
  out = tmp_path / "r"
  assert cli(["--out", str(out)] + sets(*extra)) == 2
  assert capsys.readouterr().err.strip() == message
  assert not out.exists()


SLOW_RUN = ["dataset=digits", "num_clients=30", "clients_per_round=10", "hidden=[64]",
            "batch_size=8", "local_epochs=8", "lr=0.02", "rounds=60", "eval_every=5",
            "checkpoint_every=5", "devices=1", "keep_checkpoints=20"]


def _cmd(out, *extra):
  args = [sys.executable, "-m", "fedjax_dp.cli", "run", "--no-progress", "--out", out]
  for kv in SLOW_RUN:
    args += ["--set", kv]
  return args + list(extra)


# Three CLI processes, 20 s cold: `make test-slow`. In `make test`, the Ctrl-C test
# resumes an interrupted run and test_checkpoint skips a damaged step.
@pytest.mark.slow
def test_resume_after_a_real_kill_reaches_the_same_numbers(tmp_path):
  full = str(tmp_path / "full")
  subprocess.run(_cmd(full), check=True, timeout=300, capture_output=True)

  killed = str(tmp_path / "killed")
  proc = subprocess.Popen(_cmd(killed), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  ckpt_dir = os.path.join(killed, "checkpoints")
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None:
    done = checkpoint.steps(ckpt_dir) if os.path.isdir(ckpt_dir) else []
    if done and max(done) >= 15:
      break
    time.sleep(0.05)
  assert proc.poll() is None, "the run finished before it could be killed; make SLOW_RUN longer"
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert max(checkpoint.steps(ckpt_dir)) < 60

  resumed = subprocess.run(_cmd(killed, "--resume"), timeout=300, capture_output=True, text=True)
  assert resumed.returncode == 0, resumed.stderr
  assert "resuming" in resumed.stderr
  key = lambda rows: [(r["round"], r["test_accuracy"], r["test_loss"], r["train_loss"],
                       r["bytes_up"]) for r in rows]
  assert key(read_rows(killed)) == key(read_rows(full))

  # Damage the newest checkpoint: it is reported, the previous one is used, same numbers.
  newest = max(checkpoint.steps(ckpt_dir))
  state_dir = os.path.join(ckpt_dir, str(newest), "state")
  for root, _, files in os.walk(state_dir):
    for name in files:
      with open(os.path.join(root, name), "w") as f:
        f.write("garbage")
  again = subprocess.run(_cmd(killed, "--resume", "--set", "rounds=60"), timeout=300,
                         capture_output=True, text=True)
  assert again.returncode == 0, again.stderr
  assert f"checkpoint at round {newest}" in again.stderr and "unreadable" in again.stderr
  assert key(read_rows(killed)) == key(read_rows(full))


def test_one_set_takes_several_keys_and_python_m_runs_the_console_script(tmp_path):
  """`--set rounds=2 eval_every=2` is what people type (it was 'unrecognized
  arguments'); through `python -m fedjax_dp`, the console script's entry."""
  from fedjax_dp.cli import build_parser
  args = build_parser().parse_args(["run", "--out", "x", "--set", "a=1", "b=2", "--set", "c=3"])
  assert args.set == ["a=1", "b=2", "c=3"]
  out = str(tmp_path / "run")
  done = subprocess.run([sys.executable, "-m", "fedjax_dp", "run", "--no-progress", "--out", out,
                         "--set", *FAST, "rounds=2", "eval_every=1"],
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  with open(os.path.join(out, "config.json")) as f:
    cfg = json.load(f)
  assert (cfg["rounds"], cfg["eval_every"], cfg["num_clients"]) == (2, 1, 10)
  assert [r["round"] for r in read_rows(out)] == [1, 2]


def test_print_config_is_the_runs_config_json_and_runs_nothing(tmp_path, capsys):
  out = str(tmp_path / "run")
  assert cli(["--out", out] + sets()) == 0
  capsys.readouterr()
  with open(os.path.join(out, "config.json")) as f:
    written = json.load(f)
  assert cli(["--print-config"] + sets()) == 0                  # no --out needed
  assert json.loads(capsys.readouterr().out) == written
  before = sorted(os.listdir(out))
  assert cli(["--print-config", "--resume", "--out", out, "--set", "rounds=8"]) == 0
  assert json.loads(capsys.readouterr().out) == dict(written, rounds=8)
  assert sorted(os.listdir(out)) == before and not os.path.exists(str(tmp_path / "other"))
  assert cli(["--print-config", "--out", str(tmp_path / "other")] + sets()) == 0
  assert not os.path.exists(str(tmp_path / "other"))
  assert cli(sets()) == 2                                       # a run needs its folder
  assert capsys.readouterr().err.startswith("error: fedjax-dp run: --out is required")


def test_version_is_the_packages():
  import tomllib
  with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), "rb") as f:
    version = tomllib.load(f)["project"]["version"]
  done = subprocess.run([sys.executable, "-m", "fedjax_dp", "--version"], capture_output=True,
                        text=True, timeout=120)
  assert done.returncode == 0 and done.stdout == f"fedjax-dp {version}\n", done


def test_an_unknown_key_suggests_the_nearest_ones(capsys):
  assert main(["run", "--out", "x", "--set", "round=5"]) == 2
  err = capsys.readouterr().err
  from fedjax_dp.config.schema import _FIELDS
  assert err == ("error: unknown config key 'round' (did you mean 'rounds'? `fedjax-dp config` "
                 f"lists all {len(_FIELDS)}, with their defaults and allowed values)\n")
  assert main(["run", "--out", "x", "--set", "zzz=1"]) == 2
  assert "(`fedjax-dp config` lists all" in capsys.readouterr().err


def test_usage_errors_are_one_line_with_exit_two(capsys):
  for argv in ([], ["run", "--out", "x", "--bogus"], ["account", "--q", "x"]):
    with pytest.raises(SystemExit) as e:
      main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("error: fedjax-dp") and "\n" not in err, err


# 150 rounds: the interrupt comes at the first evaluation row (round 5); with 60, the
# rest of the run took ~2.4 s alone and under the cold suite's load the run twice ended
# before the signal was handled (exit 0, nothing on stderr)
LONG = ("--set", "rounds=150")


@contextlib.contextmanager
def _sigint_as_at_a_terminal():
  """Python's SIGINT handler within. A suite started in the background (nohup) runs with
  SIGINT ignored, and a run it starts inherits that; a handler is not inherited
  across exec, so a run started within gets SIGINT's default disposition. (Not
  preexec_fn: a fork of the multithreaded JAX process that runs Python can deadlock.)"""
  outer = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, outer)


@pytest.mark.slow   # make test's 10 minutes (CI runs it in make test-slow)
def test_ctrl_c_says_interrupted_in_one_line_and_the_run_resumes(tmp_path):
  out = str(tmp_path / "int")
  with _sigint_as_at_a_terminal():
    proc = subprocess.Popen(_cmd(out, *LONG), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
  ckpt_dir, metrics = os.path.join(out, "checkpoints"), os.path.join(out, "metrics.jsonl")
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None:
    # the first evaluation row is written in the loop; a checkpoint is listed only once
    # orbax has finalised it, which under load can come late (the run had then ended)
    if (os.path.isfile(metrics) and os.path.getsize(metrics) > 0) or (
        os.path.isdir(ckpt_dir) and checkpoint.steps(ckpt_dir)):
      break
    time.sleep(0.02)
  assert proc.poll() is None, "the run ended before it could be interrupted"
  proc.send_signal(signal.SIGINT)      # lands in a checkpoint save or between them
  _, err = proc.communicate(timeout=120)
  header, *rest = err.strip().splitlines()   # the run's header line, then the interrupt's
  assert header.startswith("fedavg on digits: ") and proc.returncode == 130, err[-2000:]
  assert len(rest) == 1, err[-2000:]
  err = rest[0]
  done = checkpoint.steps(ckpt_dir)
  assert err.strip() == (f"interrupted; `fedjax-dp run --resume --out {out}` continues from "
                         f"the checkpoint at round {max(done)}" if done else
                         f"interrupted (before the first checkpoint, no checkpoint): "
                         f"`fedjax-dp run --resume --out {out}` starts over from round 0"), err
  resumed = subprocess.run(_cmd(out, "--resume", *LONG), timeout=300, capture_output=True,
                           text=True)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert read_rows(out)[-1]["round"] == 150


def test_a_ctrl_c_that_lands_in_a_gc_callback_still_ends_the_run():
  """Python swallows an exception raised in a gc callback ('Exception ignored'); JAX
  registers one. Under interrupts.installed() such a Ctrl-C is recorded instead, and
  check() (the run loop's, between chunks) raises it."""
  from fedjax_dp.experiment import interrupts
  landed = []

  def callback(phase, info):
    if phase == "start" and not landed:
      landed.append(True)
      os.kill(os.getpid(), signal.SIGINT)
      for _ in range(10_000):   # bytecodes: the handler runs here, inside the callback
        pass

  unraisable, hook = [], sys.unraisablehook
  with _sigint_as_at_a_terminal():    # else installed() leaves an ignored SIGINT so
    with interrupts.installed():
      interrupts.check()            # nothing recorded yet
      gc.callbacks.append(callback)
      sys.unraisablehook = unraisable.append
      try:
        gc.collect()                # no KeyboardInterrupt escapes the collection
      finally:
        gc.callbacks.remove(callback)
        sys.unraisablehook = hook
      assert landed and unraisable == []   # nor is one printed as 'Exception ignored'
      with pytest.raises(KeyboardInterrupt):
        interrupts.check()
      with pytest.raises(KeyboardInterrupt):   # elsewhere it raises at once, as Python's does
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000):
          pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    interrupts.check()              # outside, nothing is pending


def test_an_error_raised_while_a_ctrl_c_unwinds_ends_the_run_as_interrupted(capsys):
  """Once, a Ctrl-C in an orbax save made orbax's cleanup raise RuntimeError: exit 1
  and a traceback. The Ctrl-C is what happened; an error of the run's own is not one."""
  from fedjax_dp.cli import INTERRUPTED, run_guarded

  def cleanup_fails():
    try:
      raise KeyboardInterrupt
    except KeyboardInterrupt:
      raise RuntimeError("cannot schedule new futures after interpreter shutdown")
  assert run_guarded(cleanup_fails) == INTERRUPTED
  assert capsys.readouterr().err == "interrupted\n"

  def fails():
    try:
      raise ValueError("its own")
    except ValueError:
      raise RuntimeError("and another")
  with pytest.raises(RuntimeError, match="and another"):
    run_guarded(fails)


def test_datasets_lists_every_dataset(capsys):
  assert main(["datasets"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert [line.split()[0] for line in lines] == [
      "digits", "mnist", "fmnist", "cifar10", "femnist", "shakespeare", "emnist", "emnist_digits",
      "cifar100", "cifar100_coarse", "shakespeare_tff", "stackoverflow", "csv", "synthetic",
      "healthcare", "breast_cancer"]
  assert lines[0].split()[1] == "available"
  # one column for the status, whatever the name's length (breast_cancer broke it)
  assert len({line.index(line.split()[1]) for line in lines}) == 1, lines
  # a missing image dataset says where its files come from (the first-hour review)
  sources = {line.split()[0]: line for line in lines}
  if "missing" in sources["mnist"]:
    assert "https://" in sources["mnist"]
  if "missing" in sources["cifar10"]:
    assert "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz" in sources["cifar10"]
  for argv, words in ((["--plot", "h.png"], "needs --partition"),
                      (["--partition", "--plot", "h.txt"], "expected a .png"),
                      (["--partition", "--plot", "/nonexistent/dir/h.png"], "folder does not exist")):
    assert main(["datasets", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and words in err, err


def test_datasets_partition_counts_unused_rows_and_describes_token_data(tmp_path, capsys):
  """A shard partition that leaves rows out says how many; token sequences get their
  clients' sizes (no label histogram) and --plot refuses them in one line."""
  from fedjax_dp.data.sample_files import write_sample
  assert main(["datasets", "--partition", "--set", "dataset=digits", "--set", "partition=shard",
               "--set", "num_clients=10", "--set", "shard_size=50", "--set",
               "shards_per_client=2"]) == 0
  assert capsys.readouterr().out.splitlines()[0] == (
      "digits: 1438 training examples (438 in no client's part), 10 clients, partition shard")
  write_sample("shakespeare_tff", str(tmp_path / "s"), num_clients=6, examples_per_client=4)
  sets = ["--set", "dataset=shakespeare_tff", "--set", f"data_dir={tmp_path / 's'}", "--set",
          "partition=natural_id", "--set", "num_clients=6", "--set", "clients_per_round=3"]
  assert main(["datasets", "--partition", *sets]) == 0
  assert "targets are token sequences (80,) (no labels)" in capsys.readouterr().out
  assert main(["datasets", "--partition", "--plot", str(tmp_path / "h.png"), *sets]) == 2
  err = capsys.readouterr().err.strip()
  assert "\n" not in err and "its targets are token sequences (80,)" in err


def test_a_failed_setup_never_replaces_an_existing_run(tmp_path, capsys):
  out = tmp_path / "old"
  out.mkdir()
  (out / "metrics.jsonl").write_text("{}\n")
  (out / "config.json").write_text("{}")   # a run folder: --overwrite may replace it
  code = main(["run", "--no-progress", "--overwrite", "--out", str(out), "--set", "dp=local",
               "--set", "noise_multiplier=1", "--set", "clip_parts=tiers"])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1 and "has no sensitivity tiers" in err[0]
  assert sorted(p.name for p in out.iterdir()) == ["config.json", "metrics.jsonl"]
  code = main(["run", "--no-progress", "--out", str(tmp_path / "new"), "--set", "dataset=csv",
               "--set", f"csv_path={tmp_path / 'missing.csv'}"])
  assert code == 2 and not (tmp_path / "new" / "config.json").exists()


@pytest.mark.parametrize("algorithm", ["scaffold+contrastive", "solo"])
def test_run_with_resident_state_checkpoints_and_evaluates_in_client_order(tmp_path, algorithm):
  """Full participation with per-client state: the run keeps the state in the
  rounds' dealing layout between chunks (2 devices) and must still checkpoint it
  in client order and evaluate SOLO's per-client models as a plain
  run_rounds loop gives them."""
  import jax
  import numpy as np
  from fedjax_dp import make_config
  from fedjax_dp.core.evaluate import batch_for_eval, make_solo_evaluate
  from fedjax_dp.experiment.runner import run_experiment
  from fedjax_dp.experiment.setup import client_label_distribution, setup
  values = dict(dataset="digits", num_clients=6, clients_per_round=6, sampling="fixed",
                hidden=[16], batch_size=16, lr=0.05, rounds=4, eval_every=2,
                checkpoint_every=2, devices=2, algorithm=algorithm,
                s_local=0.5 if algorithm != "solo" else 0.0)
  cfg = make_config(values)
  out = str(tmp_path / "run")
  run_experiment(cfg, out, progress=False, log=lambda msg: None)
  ds, parts, sim = setup(cfg)
  working = sim.to_working(sim.init_state())     # the resident layout is in use
  assert not jax.tree.leaves(working.client_state)[0].sharding.is_fully_replicated
  state, _ = sim.run_rounds(sim.init_state(), 2)
  state, _ = sim.run_rounds(state, 2)
  step, saved, _ = checkpoint.restore_latest(os.path.join(out, "checkpoints"), state)
  assert step == 4
  for a, b in zip(jax.tree.leaves(state.client_state), jax.tree.leaves(saved.client_state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  if algorithm == "solo":
    eval_data = batch_for_eval(ds.x_test, ds.y_test, cfg.eval_batch_size)
    acc, _ = make_solo_evaluate(sim.model)(state.client_state["model"], *eval_data,
                                           client_label_distribution(ds, parts))
    assert read_rows(out)[-1]["test_accuracy"] == pytest.approx(float(acc), abs=1e-6)


def test_resume_keeps_a_preset_key_the_run_overrode(tmp_path):
  # found by a helper: the topksdp preset (s_global 0.9) was re-applied over the saved
  # s_global 0, and the resume was refused as a config change
  out = str(tmp_path / "t")
  common = ["--no-progress", "--out", out, "--set", "algorithm=topksdp", "--set", "s_global=0",
            "--set", "hidden=[8]", "--set", "devices=1", "--set", "eval_every=1",
            "--set", "checkpoint_every=1"]
  assert main(["run", *common, "--set", "rounds=1"]) == 0
  assert main(["run", "--resume", "--no-progress", "--out", out, "--set", "rounds=2"]) == 0
  assert json.load(open(os.path.join(out, "config.json")))["s_global"] == 0


INTERRUPTED_NOISE = """
import sys
from fedjax_dp.cli import exit_with, run_guarded
class Loud:                       # a teardown that raises, as asyncio's loop did
  def __del__(self):
    raise RuntimeError("teardown noise")
async def save():                 # a coroutine never awaited, as orbax's save was
  pass
def interrupted():
  loud, coro = Loud(), save()
  raise KeyboardInterrupt
exit_with(run_guarded(interrupted))
"""


def test_an_interrupt_says_one_line_whatever_the_interrupted_frames_leave():
  """Ctrl-C during an orbax save freed its event loop and coroutine after
  'interrupted', and their complaints reached stderr (seen under load)."""
  proc = subprocess.run([sys.executable, "-c", INTERRUPTED_NOISE], capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 130 and proc.stderr == "interrupted\n", proc.stderr


_TEARDOWN = """
import os, signal, sys
from fedjax_dp.experiment import interrupts

class FailsWhenFreed:
  def __del__(self):
    raise RuntimeError("teardown of an interrupted save")

async def never_awaited():
  pass

def complain():
  never_awaited()     # freed unawaited: RuntimeWarning 'never awaited'
  FailsWhenFreed()    # freed: 'Exception ignored in ...'

signal.signal(signal.SIGINT, signal.default_int_handler)
with interrupts.installed():
  complain()                        # before the Ctrl-C: printed as usual
  print("--ctrl-c--", file=sys.stderr, flush=True)
  try:
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(10_000):
      pass
  except KeyboardInterrupt:
    complain()                      # the interrupted teardown: silent
  print("--after--", file=sys.stderr, flush=True)
complain()                          # installed() has put Python's reporting back
"""


def test_teardown_after_a_ctrl_c_prints_nothing_until_the_run_has_ended():
  """CI once printed orbax's "coroutine '_async_serialize_shardings' was never awaited"
  before the one line 'interrupted' (a Ctrl-C mid-save frees coroutines it never
  awaited). From the Ctrl-C until interrupts.installed() exits, such complaints are
  silenced; before and after, Python reports them as usual."""
  proc = subprocess.run([sys.executable, "-c", _TEARDOWN], capture_output=True, text=True,
                        timeout=120, env={**os.environ, "PYTHONWARNINGS": "default"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  before, rest = proc.stderr.split("--ctrl-c--")
  during, after = rest.split("--after--")
  for told in (before, after):
    assert "never awaited" in told and "Exception ignored" in told, proc.stderr
  assert during.strip() == "", proc.stderr


def test_a_ctrl_c_before_anything_was_written_says_run_it_again(tmp_path):
  """The first-hour review's finding 5: a Ctrl-C in the first seconds advised a
  `--resume` that then failed (no config.json): it says to run the command again."""
  from fedjax_dp.cli import commands
  out = str(tmp_path / "early")
  commands._INTERRUPTED_RUN[:] = [(out, 0)]
  try:
    assert commands.interrupted_line() == (f"interrupted before anything was written to {out}: "
                                           "run the same command again")
    os.makedirs(out)
    open(os.path.join(out, "config.json"), "w").write("{}")
    assert commands.interrupted_line().endswith("starts over from round 0")
  finally:
    commands._INTERRUPTED_RUN.clear()


def test_resume_with_overwrite_is_refused_in_one_line(tmp_path, capsys):
  """The first-hour review's finding 12: `--resume --overwrite` ran again from round 0,
  --overwrite silently ignored. Refused (exit 2) through the CLI and the API, the
  folder untouched."""
  import fedjax_dp
  out = str(tmp_path / "mine")
  os.makedirs(out)
  open(os.path.join(out, "config.json"), "w").write("{}")
  assert main(["run", "--resume", "--overwrite", "--out", out]) == 2
  err = capsys.readouterr().err.strip()
  assert err == (f"error: --resume with --overwrite: give one (--resume continues the run in "
                 f"{out}, --overwrite replaces it)")
  with pytest.raises(fedjax_dp.errors.RunError, match="--resume with --overwrite: give one"):
    fedjax_dp.run("fedavg", out=out, resume=True, overwrite=True, progress=False)
  assert os.listdir(out) == ["config.json"]


@pytest.mark.parametrize("delay", [0.25, 0.7, 1.5])
def test_a_ctrl_c_while_the_command_starts_is_one_line(tmp_path, delay):
  """The first-hour review's finding 5: a Ctrl-C in the first second, while the command
  imports its modules and JAX, printed a 15-line KeyboardInterrupt traceback and the
  process died of the signal. Through the console script, at several moments of
  start-up: status 130 and one line."""
  fedjax_dp_cmd = os.path.join(os.path.dirname(sys.executable), "fedjax-dp")
  out = str(tmp_path / "starting")
  with _sigint_as_at_a_terminal():
    proc = subprocess.Popen([fedjax_dp_cmd, "run", "--config", "experiments/demo.yaml",
                             "--no-progress", "--out", out], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  time.sleep(delay)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=120)
  if proc.returncode == 0:
    pytest.skip(f"the run ended within {delay} s")
  assert proc.returncode == 130, (proc.returncode, err[-2000:])
  assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err[-2000:]
  assert err.startswith("interrupted"), err


def test_the_bar_says_compiling_then_times_the_rounds_after_it(tmp_path, capsys):
  """The first-hour review's finding 10: a 0 % bar for the whole compilation, then an
  ETA that counted it. The header line first, the bar 'compiling' until the first
  chunk, its rate from the rounds after it."""
  assert main(["run", "--out", str(tmp_path / "bar")] + sets()) == 0
  err = capsys.readouterr().err.replace("\r", "\n").splitlines()
  assert err[0].startswith("fedavg on digits: 10 clients, 5 a round (fixed), mlp (")
  bars = [line for line in err if "round" in line and "%|" in line]
  assert bars[0].startswith("compiling:") and "0/6" in bars[0]
  after = [line for line in bars if "2/6" in line]
  assert after and not any(line.startswith("compiling") for line in after), bars


@pytest.mark.parametrize("argv,says", [
    (["compare", "x", "--plot"], "argument --plot: expected one argument (see"),
    (["compare", "x", "--sort", "-test_accuracy"],
     "(a value that starts with '-' is written --sort=-VALUE)"),
    (["account", "--noise-multipler", "1"], "(did you mean --noise-multiplier?)"),
    (["--verbose", "run"], "error: fedjax-dp: unrecognized arguments: --verbose"),
    (["run", "--outdir", "x"], "error: fedjax-dp run: unrecognized arguments: --outdir x (did "
                               "you mean --out?)"),
])
def test_usage_errors_name_the_command_and_the_likely_fix(argv, says, capsys):
  """The first-hour review's finding 13 and the independent audit's: the command the
  option belongs to, the nearest option, and the '--sort=-x' hint only where it applies."""
  with pytest.raises(SystemExit) as e:
    main(argv)
  err = capsys.readouterr().err.strip()
  assert e.value.code == 2 and says in err and "\n" not in err, err
