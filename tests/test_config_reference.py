"""The config keys' reference (experiment/config_reference.py): complete, consistent with what
the checks accept, the README's table generated from it, and `fedjax-dp config`
through the real console script."""

import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest

from fedjax_dp import make_config
from fedjax_dp.config import Config
from fedjax_dp.config.checks import _check_keys
from fedjax_dp.config.schema import _OPTIONAL, CHOICES, RANGES
from fedjax_dp.errors import ConfigError
from fedjax_dp.experiment import config_reference as reference
from fedjax_dp.recipes.config_checks import (_SWITCHES, _check_registered, read_condition,
                                           unread_keys)

from fedjax_dp.config.schema import _FIELDS  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..")
FEDJAX_DP = os.path.join(os.path.dirname(sys.executable), "fedjax-dp")   # the console script
KEYS = list(_FIELDS)   # the Config's keys (its plugin_values field holds plugins' keys)


def test_every_key_is_listed_once_with_a_meaning():
  listed = [k for keys in reference.SECTIONS.values() for k in keys]
  assert sorted(listed) == sorted(KEYS) and len(listed) == len(set(listed))
  assert set(reference.MEANINGS) == set(KEYS)
  assert all(reference.MEANINGS[k] and "\n" not in reference.MEANINGS[k] for k in KEYS)


def test_the_docs_table_is_the_generated_one():
  with open(os.path.join(ROOT, "docs", "reference", "config.md")) as f:
    text = f.read()
  assert reference.page_with_table(text) == text, (
      "the docs' config key table is stale: run `.venv/bin/python -m "
      "fedjax_dp.experiment.config_reference docs/reference/config.md`")


def test_defaults_are_written_as_yaml_reads_them_back():
  import yaml
  for key in KEYS:
    shown = reference.reference(key).default
    assert make_config({key: yaml.safe_load(shown)}, refuse_unread=False) == Config(), key


def _accepted(key, value) -> bool:
  """Does the key's own check (its choices, its range) accept `value`? Limits that
  involve other keys are stated apart (reference._LIMITS)."""
  try:
    cfg = dataclasses.replace(Config(), **{key: value})
    _check_keys(cfg, {})
    _check_registered(cfg)   # a registry's names (aggregator, dp)
    return True
  except ConfigError:
    return False


def _probes(text: str, is_int: bool) -> list[tuple[float, bool]]:
  """(value, accepted?) at each bound the text states and one step beyond it."""
  beyond = (lambda v, d: v + d) if is_int else (lambda v, d: math.nextafter(v, d * math.inf))
  if ".." in text:                                  # 1..1048575: whole numbers, both inclusive
    lo, hi = (int(v) for v in text.split(".."))
    return [(lo, True), (lo - 1, False), (hi, True), (hi + 1, False)]
  if text[0] in "[(":                               # [0, 1): an interval of reals
    lo, hi = (float(v) for v in text[1:-1].split(", "))
    return [(lo, text[0] == "["), (beyond(lo, -1), False),
            (hi, text[-1] == "]"), (beyond(hi, 1), False)]
  op, bound = text.split(" ")
  bound = int(bound) if is_int else float(bound)
  sign = 1 if op[0] == ">" else -1
  return [(bound, op.endswith("=")), (beyond(bound, -sign), False),
          (beyond(bound, sign), True)]


@pytest.mark.parametrize("key", sorted(RANGES))
def test_a_stated_range_is_what_the_checks_accept(key):
  """The reference's range text, read back, against what make_config accepts: each
  bound accepted or refused as the text says, a step beyond it refused."""
  is_int = _OPTIONAL.get(key, type(getattr(Config(), key))) is int
  text = reference._range_text(key, is_int)
  for value, ok in _probes(text, is_int):
    assert _accepted(key, value) == ok, (key, text, value)


@pytest.mark.parametrize("key", sorted(CHOICES))
def test_every_listed_choice_is_accepted_and_nothing_else(key):
  choices = reference.allowed_values(key).split("; ")[0].split(", ")
  assert all(_accepted(key, value) for value in choices), choices
  assert not _accepted(key, "no-such-" + key)


CONFIGS = [{}, {"dp": "central", "noise_multiplier": 1.0},
           {"dp": "local", "noise_multiplier": 1.0, "clip_parts": "tiers",
            "dataset": "healthcare", "noise_schedule": "convergence", "tier_source": "analyzer"},
           {"algorithm": "topksdp"}, {"algorithm": "fedadam", "aggregator": "krum",
                                      "num_clients": 10, "clients_per_round": 10},
           {"sampling": "poisson", "partition": "shards", "lr_schedule": "cosine"},
           {"dp": "central", "noise_multiplier": 1.0, "adaptive_clipping": True,
            "client_state_store": "disk", "algorithm": "fedprox"}]


@pytest.mark.parametrize("overrides", CONFIGS)
def test_a_key_a_run_leaves_unread_names_what_reads_it_or_is_a_switch(overrides):
  """The refusal of an unread key and `fedjax-dp config --show` both name the
  setting that reads it; the rest are switches, read once set."""
  unread = unread_keys(make_config(overrides))
  assert unread, overrides
  for key in unread:
    assert read_condition(key) is not None or key in _SWITCHES, key


DP = {"dp": "local", "noise_multiplier": 1.0}
SWITCHED = {"dp": DP, "coordinate_clip": {"coordinate_clip": 1.0},
            "update_clip_l2": {"update_clip_l2": 1.0}, "s_local": {"s_local": 0.5},
            "s_global": {"s_global": 0.5}, "shuffle": {"shuffle": "layerwise", "s_local": 0.5},
            "kept_noise": {"kept_noise": "multiplier", "s_local": 0.5, "final_clip_l2": 1.0},
            "adaptive_clipping": {"adaptive_clipping": True, "dp": "central",
                                  "noise_multiplier": 1.0},
            "client_budgets": dict(DP, client_budgets="allocated", target_epsilon=20.0)}
# (cluster_noise was a switch; since issue 40 it is the cluster rule's key, read with
# aggregator 'cluster')


def test_a_switch_set_away_from_its_default_is_read():
  assert set(SWITCHED) == _SWITCHES
  for key, overrides in SWITCHED.items():
    cfg = make_config(overrides)
    assert key not in unread_keys(cfg) and read_condition(key) is None, key


def _fedjax_dp(*args):
  assert os.path.exists(FEDJAX_DP), "the console script is installed with the package"
  return subprocess.run([FEDJAX_DP, *args], capture_output=True, text=True, timeout=120)


def test_config_lists_every_key_with_default_allowed_and_meaning():
  done = _fedjax_dp("config")
  assert done.returncode == 0 and not done.stderr, done
  rows = {line.split()[0]: line for line in done.stdout.splitlines()
          if line and not line.startswith("#")}
  assert sorted(rows) == sorted(KEYS)
  assert rows["rounds"].split()[:2] == ["rounds", "50"] and "1..1048575" in rows["rounds"]
  assert ("fixed, poisson, cyclic, cyclic_poisson, balls_in_bins, min_sep  -- fixed: uniform "
          "without replacement") in rows["sampling"]
  assert rows["s_local"].split()[1:4] == ["0", "(topksdp:", "0.9)"]


@pytest.mark.slow   # make test's 10 minutes (CI runs it in make test-slow)
def test_config_show_names_what_reads_a_key_and_refuses_an_unknown_one():
  done = _fedjax_dp("config", "--show", "prox_mu", "noise_multiplier")
  assert done.returncode == 0, done
  assert done.stdout.startswith("prox_mu\n  section:  algorithm and server\n  default:  0.001\n"
                                "  allowed:  >= 0\n  read:     with algorithm 'fedprox'\n")
  assert "noise_multiplier\n" in done.stdout and \
      "read:     with dp 'central' or 'local'" in done.stdout
  done = _fedjax_dp("config", "--show", "round")
  assert done.returncode == 2 and done.stdout == ""
  assert done.stderr == ("error: unknown config key 'round' (did you mean 'rounds'? `fedjax-dp "
                         f"config` lists all {len(KEYS)}, with their defaults and allowed "
                         "values)\n")
  done = _fedjax_dp("config", "--markdown", "--show", "lr")   # would be ignored: refused
  assert done.returncode == 2 and done.stderr.startswith("error: fedjax-dp config --markdown")


def test_config_json_is_the_reference():
  done = _fedjax_dp("config", "--json")
  assert done.returncode == 0, done
  got = json.loads(done.stdout)
  assert [r["key"] for r in got] == [k for ks in reference.SECTIONS.values() for k in ks]
  assert got == [r.to_dict() for r in reference.all_references()]
