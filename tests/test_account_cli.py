"""`fedjax-dp account`: figures against dp-accounting, target calibration, shuffle, bad values."""

import json

import pytest

from fedjax_dp.cli import main

dpa = pytest.importorskip("dp_accounting")


def run_json(capsys, *argv):
  assert main(["account", *argv, "--json"]) == 0
  return json.loads(capsys.readouterr().out)


def test_rdp_and_pld_against_dp_accounting(capsys):
  args = ["--q", "0.01", "--noise-multiplier", "1.1", "--steps", "1000", "--delta", "1e-5"]
  rdp = run_json(capsys, *args)
  oracle = dpa.rdp.RdpAccountant()
  oracle.compose(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.1)), 1000)
  eps, order = oracle.get_epsilon_and_optimal_order(1e-5)
  assert rdp["epsilon"] == pytest.approx(eps, rel=1e-3) and rdp["order"] == order
  pld = run_json(capsys, *args, "--accountant", "pld")
  assert pld["epsilon"] == pytest.approx(1.515370, rel=1e-4)   # JAX_NOTES.md
  assert pld["epsilon"] < rdp["epsilon"]


def test_target_epsilon_gives_the_noise_multiplier(capsys):
  res = run_json(capsys, "--q", "0.01", "--target-epsilon", "2", "--steps", "1000",
                 "--delta", "1e-5")
  z = res["noise_multiplier"]
  oracle = dpa.rdp.RdpAccountant()
  oracle.compose(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(z)), 1000)
  assert oracle.get_epsilon(1e-5) <= 2.0 * (1 + 1e-6)
  oracle = dpa.rdp.RdpAccountant()
  oracle.compose(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(z * 0.995)), 1000)
  assert oracle.get_epsilon(1e-5) > 2.0


def test_text_output(capsys):
  assert main(["account", "--q", "0.01", "--noise-multiplier", "1.1", "--steps", "1000",
               "--delta", "1e-5"]) == 0
  assert capsys.readouterr().out.startswith("epsilon = 1.7117")


def test_fixed_size_sampling_against_dp_accounting(capsys):
  res = run_json(capsys, "--q", "0.1", "--noise-multiplier", "2.0", "--steps", "500",
                 "--delta", "1e-5", "--sampling", "fixed", "--population", "1000")
  assert res["sample_size"] == 100 and "replace one" in res["neighbouring"]
  # replace-one sensitivity of a clipped sum is 2C: std 2.0 C is multiplier 1.0
  oracle = dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
  oracle.compose(dpa.SampledWithoutReplacementDpEvent(1000, 100, dpa.GaussianDpEvent(1.0)), 500)
  eps, order = oracle.get_epsilon_and_optimal_order(1e-5)
  assert res["epsilon"] == pytest.approx(eps, rel=1e-3) and res["order"] == order
  # and a target epsilon is met
  res = run_json(capsys, "--q", "0.1", "--target-epsilon", f"{eps}", "--steps", "500",
                 "--delta", "1e-5", "--sampling", "fixed", "--population", "1000")
  assert res["noise_multiplier"] == pytest.approx(2.0, rel=1e-3)
  assert main(["account", "--q", "0.1", "--noise-multiplier", "2", "--steps", "500", "--delta",
               "1e-5", "--sampling", "fixed", "--population", "1000"]) == 0
  assert "fixed-size cohorts of 100 of 1000" in capsys.readouterr().out


def test_shuffle(capsys):
  res = run_json(capsys, "shuffle", "--eps0", "4", "--n", "100000", "--delta", "1e-6")
  assert res["amplified"] and res["epsilon"] == pytest.approx(0.535, abs=5e-4)
  assert "Feldman" in res["bound"]
  res = run_json(capsys, "shuffle", "--eps0", "4", "--n", "100", "--delta", "1e-5")
  assert not res["amplified"] and res["epsilon"] == 4.0 and "no amplification" in res["reason"]


@pytest.mark.parametrize("argv,fragment", [
    (["--q", "0", "--noise-multiplier", "1", "--steps", "10", "--delta", "1e-5"], "--q = 0"),
    (["--q", "1.5", "--noise-multiplier", "1", "--steps", "10", "--delta", "1e-5"], "--q = 1.5"),
    (["--q", "0.1", "--noise-multiplier", "-1", "--steps", "10", "--delta", "1e-5"],
     "--noise-multiplier = -1"),
    (["--q", "0.1", "--noise-multiplier", "1", "--steps", "0", "--delta", "1e-5"], "--steps = 0"),
    (["--q", "0.1", "--noise-multiplier", "1", "--steps", "10", "--delta", "1"], "--delta = 1"),
    (["--q", "0.1", "--steps", "10", "--delta", "1e-5"], "exactly one of"),
    (["shuffle", "--eps0", "1", "--n", "0", "--delta", "1e-5"], "--n = 0"),
    (["--q", "0.1", "--noise-multiplier", "1", "--steps", "10", "--delta", "1e-5", "--sampling",
      "fixed"], "--population is required"),
    (["--q", "0.15", "--noise-multiplier", "1", "--steps", "10", "--delta", "1e-5", "--sampling",
      "fixed", "--population", "25"], "whole cohort size"),
    (["--q", "0.1", "--noise-multiplier", "1", "--steps", "10", "--delta", "1e-5", "--sampling",
      "fixed", "--population", "100", "--accountant", "pld"], "no sampling-without-replacement"),
    (["--q", "0.1", "--noise-multiplier", "1", "--steps", "10", "--delta", "1e-5",
      "--population", "100"], "--population is for --sampling fixed"),
    (["--q", "0.1", "--noise-multiplier", "0.001", "--steps", "10", "--delta", "1e-5",
      "--accountant", "pld"], "noise multiplier 0.001: the PLD accountant needs >= 0.01"),
])
def test_bad_values_exit_two_with_one_line(capsys, argv, fragment):
  assert main(["account", *argv]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and fragment in err and "\n" not in err
