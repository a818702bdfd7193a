"""placement/host.py: the CPU device count asked before JAX starts, and refused when
FEDJAX_DP_CPU_DEVICES and XLA_FLAGS disagree (one would be silently ignored)."""

import os
import subprocess
import sys

import pytest

from fedjax_dp.placement.host import _FLAG, use_cpu_devices

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def env(monkeypatch):
  monkeypatch.delenv("FEDJAX_DP_CPU_DEVICES", raising=False)
  monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")
  return monkeypatch


def test_the_variable_sets_the_flag(env):
  env.setenv("FEDJAX_DP_CPU_DEVICES", "3")
  assert use_cpu_devices() == 3
  assert os.environ["XLA_FLAGS"] == f"--xla_backend_optimization_level=0 {_FLAG}=3"


def test_one_device_sets_nothing(env):
  env.setenv("FEDJAX_DP_CPU_DEVICES", "1")
  assert use_cpu_devices() is None
  assert os.environ["XLA_FLAGS"] == "--xla_backend_optimization_level=0"


def test_a_flag_that_agrees_is_kept(env):
  env.setenv("XLA_FLAGS", f"{_FLAG}=4")
  env.setenv("FEDJAX_DP_CPU_DEVICES", "4")
  assert use_cpu_devices() is None
  assert os.environ["XLA_FLAGS"] == f"{_FLAG}=4"
  env.delenv("FEDJAX_DP_CPU_DEVICES")
  assert use_cpu_devices() is None   # the flag alone: the user's own, kept


@pytest.mark.parametrize("value, message", [
    ("1", f"FEDJAX_DP_CPU_DEVICES=1 asks for 1 CPU device(s), but XLA_FLAGS sets {_FLAG}=8"),
    ("two", "FEDJAX_DP_CPU_DEVICES='two' is not a device count: give a whole number >= 1"),
    ("0", "FEDJAX_DP_CPU_DEVICES='0' is not a device count"),
    ("-2", "FEDJAX_DP_CPU_DEVICES='-2' is not a device count")])
def test_bad_or_disagreeing_requests_are_refused(env, value, message):
  env.setenv("XLA_FLAGS", f"{_FLAG}=8")
  env.setenv("FEDJAX_DP_CPU_DEVICES", value)
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
    use_cpu_devices()


@pytest.mark.parametrize("command", [
    [sys.executable, "-m", "fedjax_dp.cli", "run", "--print-config"],
    [sys.executable, os.path.join(ROOT, "experiments", "adversarial", "run.py"), "--help"]])
def test_commands_refuse_in_one_line_with_status_2(command):
  env = dict(os.environ, XLA_FLAGS=f"{_FLAG}=8", FEDJAX_DP_CPU_DEVICES="1", PYTHONPATH=ROOT)
  done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
  assert done.returncode == 2, done.stderr
  assert done.stderr.splitlines() == [
      f"error: FEDJAX_DP_CPU_DEVICES=1 asks for 1 CPU device(s), but XLA_FLAGS sets "
      f"{_FLAG}=8, which would win: unset one or make them agree"]
  assert done.stdout == ""
