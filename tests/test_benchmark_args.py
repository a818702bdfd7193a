"""Benchmark scripts refuse bad counts in one line with exit status 2."""

import argparse
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from cli_args import new_file, nonnegative_int, positive_float, positive_int  # noqa: E402


def test_positive_float_accepts_its_range_and_names_the_bad_value():
  assert positive_float("8") == 8.0 and positive_float("0.5") == 0.5
  for bad in ("0", "-1", "x", "inf", "nan"):
    with pytest.raises(argparse.ArgumentTypeError, match=f"'{bad}': allowed are finite numbers"):
      positive_float(bad)


def test_count_types_accept_their_range_and_name_the_bad_value():
  assert positive_int("1") == 1 and positive_int("12") == 12
  assert nonnegative_int("0") == 0
  for fn, bad in ((positive_int, "0"), (positive_int, "-2"), (positive_int, "x"),
                  (positive_int, "1.5"), (nonnegative_int, "-1")):
    with pytest.raises(argparse.ArgumentTypeError, match=f"'{bad}': allowed are whole numbers"):
      fn(bad)


WHOLE = "allowed are whole numbers >= 1"


@pytest.mark.parametrize("script", ["fedavg_round.py", "topksdp_round.py", "compare_trees.py",
                                    "accountant_share.py", "cross_device.py", "scaling.py"])
def test_scripts_refuse_to_overwrite_a_results_file_before_running(script, tmp_path):
  old = tmp_path / "old.json"
  old.write_text("{}")
  out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script),
                        "--json", str(old)], capture_output=True, text=True, timeout=120)
  assert out.returncode == 2
  assert out.stderr.strip().splitlines()[-1].endswith(f"'{old}' exists; name a new file")
  assert old.read_text() == "{}"
  assert new_file(str(tmp_path / "new.json")) == str(tmp_path / "new.json")


@pytest.mark.parametrize("script,args,allowed", [
    ("fedavg_round.py", ["--rounds", "0"], WHOLE),
    ("dynamic_dp_protocol.py", ["--repeats", "0"], WHOLE),
    ("topksdp_round.py", ["--chunks", "-1"], WHOLE),
    ("cross_device.py", ["--rounds", "0"], WHOLE),
    ("scaling.py", ["--rounds", "0"], WHOLE),
    ("scaling.py", ["--max-table-gb", "-1"], "allowed are finite numbers > 0")])
def test_scripts_refuse_a_bad_count_with_exit_2(script, args, allowed):
  out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), *args],
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 2
  assert out.stderr.strip().splitlines()[-1].endswith(allowed)


def test_topksdp_benchmark_control_is_a_second_fedavg_in_the_alternation():
  import topksdp_round
  res = topksdp_round.round_times("digits", chunks=2, chunk_rounds=1,
                                  variants=[("fedavg", {}), topksdp_round.CONTROL])
  assert set(res["all"]) == {"fedavg", "fedavg_again"}
  assert all(len(ts) == 2 and min(ts) > 0 for ts in res["all"].values())
  ratios = [x / y for x, y in zip(res["all"]["fedavg_again"], res["all"]["fedavg"])]
  # the median of the two cycles' ratios is their mean
  assert res["over_fedavg_paired"]["fedavg_again"] == pytest.approx(sum(ratios) / 2)
