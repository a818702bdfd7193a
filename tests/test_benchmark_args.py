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
                                    "accountant_share.py", "cross_device.py", "scaling.py",
                                    "sweep.py", "kernels.py", "sharded_table.py",
                                    "before_after.py", "same_program.py", "accuracy.py",
                                    "peer_protocols.py", "conv_round.py"])
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
    ("sweep.py", ["--seeds", "0"], WHOLE),
    ("kernels.py", ["--repeats", "0"], WHOLE),
    ("kernels.py", ["--sizes", "huge"], "--sizes 'huge': allowed are small, medium, large "
                                        "(comma-separated)"),
    ("scaling.py", ["--max-table-gb", "-1"], "allowed are finite numbers > 0"),
    ("sharded_table.py", ["--repeats", "0"], WHOLE),
    ("sharded_table.py", ["--points", "100:100"], "'100:100': allowed is CLIENTS:COHORT, whole "
     "numbers with 1 <= COHORT < CLIENTS (a partial cohort: with every client, the table is "
     "resident)")])
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


def test_scaling_peers_train_on_the_arrays_our_point_trains_on(tmp_path):
  import numpy as np
  import scaling
  from fedjax_dp.experiment.setup import setup
  scaling.write_peer_data(50, 10, str(tmp_path / "data.npz"))
  with np.load(tmp_path / "data.npz") as f:
    x, y, starts = f["x"], f["y"], f["starts"]
  assert len(starts) == 51 and starts[-1] == len(x) == 100
  for kind in ("stateless", "stateful"):     # one file serves both points of a size
    ds, parts, _ = setup(scaling.point_config(50, 10, kind))
    for c in range(50):
      np.testing.assert_array_equal(x[starts[c]:starts[c + 1]], ds.x_train[parts[c]])
      np.testing.assert_array_equal(y[starts[c]:starts[c + 1]], ds.y_train[parts[c]])


def test_scaling_skips_a_peer_point_whose_predicted_round_is_over_the_timeout():
  import scaling
  measured = {"clients": 1000, "cohort": 1000, "median_round_s": 10.0, "clients_per_s": 100}
  assert scaling.peer_skip(None, 10000, 2, 600) is None
  # 10,000 clients at 100 a second: 100 s a round, 3 rounds = 300 s
  assert scaling.peer_skip(measured, 10000, 2, 301) is None
  why = scaling.peer_skip(measured, 10000, 2, 299)
  assert why == ("not run: 100 clients/s at 1000 clients predicts 100 s a round, 3 rounds "
                 "over --peer-timeout 299 s")
  failed = {"clients": 100, "failed": "exit 1"}
  assert scaling.peer_skip(failed, 1000, 2, 600) == \
      "not run: failed or skipped at 100 clients"


def test_scaling_refuses_a_named_peer_without_its_venv(tmp_path, monkeypatch, capsys):
  import scaling
  monkeypatch.setattr(scaling, "PEERS_DIR", str(tmp_path))
  with pytest.raises(SystemExit) as exit_:
    scaling.main(["--peers", "pfl", "--clients", "100"])
  assert exit_.value.code == 2
  assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
      "is missing; build it with sh benchmarks/peers/setup_pfl.sh")
  with pytest.raises(SystemExit) as exit_:
    scaling.main(["--peers", "fedjax", "--kind", "stateful"])
  assert exit_.value.code == 2
  assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
      "--peers fedjax: it runs the stateless points only, and --kind asks for stateful")


@pytest.mark.slow
@pytest.mark.parametrize("name,kind", [("fedjax", "stateless"), ("pfl", "stateless"),
                                       ("pfl", "stateful"), ("flower", "stateless")])
def test_a_built_peer_times_rounds_of_the_scaling_protocol(name, kind, tmp_path):
  import scaling
  if not os.path.exists(scaling.peer_python(name)):
    pytest.skip(f"no {name} venv: {scaling.PEERS[name][2]}")
  scaling.write_peer_data(20, 10, str(tmp_path / "data.npz"))
  res = scaling.run_peer(name, 20, 10, str(tmp_path / "data.npz"), 2, 300, kind)
  assert res["library"] == name and res["clients"] == 20 and res["cohort"] == 10, res
  assert res["kind"] == kind and res.get("algorithm", "fedavg") == scaling.PEER_ALGORITHM[kind]
  assert len(res["round_s"]) == 2 and res["median_round_s"] > 0


@pytest.mark.slow   # about a minute of compiling; the kernels' own tests check each one
def test_kernel_benchmark_agrees_with_its_references_at_the_small_size(tmp_path):
  out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "kernels.py"),
                        "--sizes", "small", "--repeats", "1", "--json",
                        str(tmp_path / "k.json")], capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-2000:]
  import json
  with open(tmp_path / "k.json") as f:
    rows = json.load(f)["rows"]
  kernels = {r["kernel"] for r in rows}
  assert {"l2_clip", "per_part_clip", "topk_mask (k = d/10)", "gaussian_noise",
          "contrastive (bounded)", "weighted_mean"} <= kernels
  assert sum(k.startswith("robust: ") for k in kernels) == 9   # every rule, filtered mean too
  assert all(r["agrees"] and r["seconds"] > 0 for r in rows)

