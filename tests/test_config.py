"""Bad config keys and values: one-line errors naming the key and what is allowed."""

import subprocess
import sys

import pytest

from fedjax_dp import load_config, make_config
from fedjax_dp.config import Config, parse_set
from fedjax_dp.errors import ConfigError
from fedjax_dp.recipes.config_checks import unread_keys


# a complete kept-noise guarantee but for the algorithm
KEPT = {"s_local": 0.9, "kept_noise": "multiplier", "kept_noise_multiplier": 4.0,
        "final_clip_l2": 1.0, "index_selection": "random_k"}


@pytest.mark.parametrize("overrides,fragment", [
    ({"alpah": 0.5}, "unknown config key 'alpah'"),
    ({"alpha": 0}, "'alpha' = 0: must be > 0"),
    ({"alpha": "high"}, "'alpha' = 'high': expected a number"),
    ({"num_clients": 2.5}, "'num_clients' = 2.5: expected an integer"),
    ({"momentum": 1.0}, "'momentum' = 1.0: must be >= 0 and < 1"),
    ({"sampling": "random"}, "'sampling' = 'random': allowed values are fixed, poisson"),
    ({"dataset": "imagenet"}, "allowed values are digits, mnist, fmnist, cifar10, femnist, shakespeare"),
    ({"clients_per_round": 30}, "'clients_per_round' = 30: must be <= num_clients (20)"),
    ({"hidden": [200, 0]}, "'hidden'"),
    ({"rounds": 0}, "'rounds' = 0: must be >= 1"),
    ({"lr": float("nan")}, "'lr' = nan: expected a finite number"),
    ({"dataset": "csv"}, "'csv_path' is required"),
    # found by an audit: delta >= 1 / N was accepted and reported epsilon 0.0
    ({"dp": "central", "noise_multiplier": 1.0, "delta": 0.3},
     "'delta' = 0.3 with dp 'central': must be < 1 / num_clients = 0.05"),
    ({"dp": "local", "noise_multiplier": 1.0, "delta": 0.05},
     "'delta' = 0.05 with dp 'local': must be < 1 / num_clients = 0.05"),
    ({"algorithm": "topksdp", "kept_noise": "multiplier", "final_clip_l2": 1.0,
      "ldp_delta": 0.1}, "'ldp_delta' = 0.1 with kept_noise 'multiplier': must be < 1 / "
                         "num_clients = 0.05"),
    # found by an audit: local DP's epsilon is a dense noised vector's, the upload's
    # top-k positions are the private update's, unnoised
    ({"dp": "local", "noise_multiplier": 1.0, "s_local": 0.9},
     "'index_selection' = 'topk' with dp 'local' and s_local 0.9: the top-k positions"),
    # found by an audit: reported the kept-noise guarantee as complete (epsilon 4.73)
    # while SCAFFOLD's control-variate update reaches the server unnoised
    (dict(KEPT, algorithm="scaffold"), "'kept_noise' = 'multiplier' with algorithm 'scaffold': "
                                       "SCAFFOLD's control-variate update"),
    (dict(KEPT, algorithm="topksdp+scaffold"), "with algorithm 'topksdp+scaffold': SCAFFOLD's"),
    (dict(KEPT, algorithm="solo"), "'kept_noise' = 'multiplier' with algorithm 'solo'"),
])
def test_bad_values_are_named(overrides, fragment):
  with pytest.raises(ConfigError) as e:
    make_config(overrides)
  msg = str(e.value)
  assert fragment in msg
  assert "\n" not in msg


def test_defaults_are_valid_and_overrides_apply():
  cfg = make_config({"alpha": 0.1, "hidden": "64,32", "rounds": 3})
  assert cfg.alpha == 0.1 and cfg.hidden == (64, 32) and cfg.rounds == 3
  assert make_config() == Config()


def test_yaml_then_set(tmp_path):
  path = tmp_path / "c.yaml"
  path.write_text("num_clients: 50\nalpha: 0.3\nhidden: [10]\n")
  cfg = load_config(str(path), ["alpha=1e-2", "sampling=poisson"])
  assert (cfg.num_clients, cfg.alpha, cfg.hidden, cfg.sampling) == (50, 0.01, (10,), "poisson")
  assert parse_set(["hidden=[3, 4]"]) == {"hidden": [3, 4]}
  with pytest.raises(ConfigError, match="expected key=value"):
    parse_set(["alpha"])
  bad = tmp_path / "bad.yaml"
  bad.write_text("alpha: [1,\n")
  with pytest.raises(ConfigError, match="not valid YAML"):
    load_config(str(bad))
  with pytest.raises(ConfigError, match="does not exist"):
    load_config(str(tmp_path / "missing.yaml"))


def test_cli_exit_status_two_without_traceback(tmp_path):
  out = tmp_path / "run"
  proc = subprocess.run([sys.executable, "-m", "fedjax_dp.cli", "run", "--out", str(out),
                         "--set", "alpha=-1"], capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.strip() == "error: config key 'alpha' = -1: must be > 0"
  assert not out.exists()


def test_delta_below_one_over_num_clients_is_accepted():
  # the bound only applies where a delta is used; without dp nothing reads delta,
  # and setting it is refused as any key nothing reads
  with pytest.raises(ConfigError, match="'delta' = 0.3 is read by nothing in this run: it is "
                     "read with dp 'central' or 'local'"):
    make_config({"delta": 0.3})
  assert make_config({"dp": "central", "noise_multiplier": 1.0, "delta": 0.049}).delta == 0.049
  assert make_config({"algorithm": "topksdp", "kept_noise": "multiplier", "final_clip_l2": 1.0,
                      "ldp_delta": 0.049}).ldp_delta == 0.049


def test_local_dp_with_top_k_needs_data_independent_indices():
  # index_selection defaults to topk but only matters with s_local > 0
  assert make_config({"dp": "local", "noise_multiplier": 1.0}).s_local == 0
  for selection in ("random_k", "public_topk"):
    make_config({"dp": "local", "noise_multiplier": 1.0, "s_local": 0.9,
                 "index_selection": selection})
  make_config({"dp": "central", "noise_multiplier": 1.0, "s_local": 0.9})   # a trusted server


def test_experiment_configs_still_validate():
  import glob
  import os
  root = os.path.join(os.path.dirname(__file__), "..", "experiments")
  from fedjax_dp.sweeps import load_sweep
  from tests.helpers import is_sweep_file
  sweeps = 0
  for path in glob.glob(os.path.join(root, "**", "*.yaml"), recursive=True):
    if is_sweep_file(path):   # every cell of a sweep file
      sweeps += bool(load_sweep(path).cells())
    else:
      load_config(path, PROTOCOL_SETS.get(os.path.relpath(path, root), []))
  assert sweeps >= 2


# experiment YAMLs that are protocols whose arms choose the DP mechanism: alone, their
# clip is read by nothing (the script leaves it out of its no-privacy arm: load_protocol)
PROTOCOL_SETS = {"dynamic_dp/base.yaml": ["dp=central", "target_epsilon=1.9"],
                 "adversarial/fmnist.yaml": ["dp=central", "target_epsilon=1.9"]}


def test_a_protocol_without_its_mechanism_is_refused_and_its_script_drops_the_clip():
  import os
  root = os.path.join(os.path.dirname(__file__), "..", "experiments")
  with pytest.raises(ConfigError, match="'clip_norm' = 0.1 is read by nothing in this run: it "
                     "is read with dp 'central' or 'local'"):
    load_config(os.path.join(root, "dynamic_dp", "base.yaml"))
  from tests.helpers import experiment_script
  dynamic_dp_run = experiment_script("dynamic_dp")
  assert dynamic_dp_run.load_protocol({}).clip_norm == Config().clip_norm
  assert dynamic_dp_run.load_protocol({"dp": "central", "target_epsilon": 1.9}).clip_norm == 0.1


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "contrastive", "topksdp", "moon",
                                       "fedadmm", "fedprox+contrastive"])
def test_kept_noise_with_algorithms_that_send_only_the_noised_upload(algorithm):
  assert make_config(dict(KEPT, algorithm=algorithm)).kept_noise == "multiplier"


def test_rounds_stop_below_the_model_initialisation_key():
  """Round r's key is fold_in(run_key, r); the model's is fold_in(run_key, 2^20)."""
  from fedjax_dp.core.state import MODEL_INIT
  assert MODEL_INIT == 2**20
  make_config({"rounds": 2**20 - 1})
  with pytest.raises(ConfigError, match=r"'rounds' = 1048576: must be >= 1 and < 1048576"):
    make_config({"rounds": 2**20})


DP_ON = {"dp": "central", "noise_multiplier": 1.0}


@pytest.mark.parametrize("key, value, variant", [
    ("tier_noise_multipliers", (1.0,) * 5, {"clip_parts": "per_layer"}),
    ("rest_tier", "high", {}),
    ("convergence_window", 3, {}),
    ("noise_ema", 0.5, {}),
    ("convergence_beta", 0.5, {"noise_schedule": "weighted", "clip_parts": "tiers",
                               "dataset": "healthcare"}),
    ("analyzer_rule", "fused", {"clip_parts": "tiers", "dataset": "healthcare"}),
])
def test_a_mechanism_key_its_variant_does_not_read_is_refused(key, value, variant):
  """With dp on, a key read only by another variant of the mechanism (tier multipliers
  under flat clipping, the controller's keys under a static schedule) is refused."""
  with pytest.raises(ConfigError, match=f"'{key}' = .* is read by nothing in this run"):
    make_config({**DP_ON, **variant, key: value})


@pytest.mark.parametrize("key, value, enable, reads", [
    ("noise_multiplier", 1.0, {"dp": "central"}, "dp 'central' or 'local' (without dp the run "
                                                  "has no privacy)"),
    ("target_epsilon", 1.0, {"dp": "central"}, "dp 'central' or 'local'"),
    ("clip_norm", 0.1, {"dp": "local", "noise_multiplier": 1.0}, "dp 'central' or 'local'"),
    ("prox_mu", 0.1, {"algorithm": "fedprox"}, "algorithm 'fedprox'"),
    ("admm_rho", 0.1, {"algorithm": "fedadmm"}, "algorithm 'fedadmm'"),
    ("trim_fraction", 0.2, {"aggregator": "trimmed_mean"}, "aggregator 'trimmed_mean'"),
    ("byzantine_f", 1, {"aggregator": "krum", "num_clients": 10, "clients_per_round": 10},
     "aggregator 'krum' or 'multi_krum'"),
    ("clip_lr", 0.5, {"dp": "central", "noise_multiplier": 1.0, "adaptive_clipping": True},
     "adaptive_clipping true"),
    ("kept_noise_multiplier", 1.0, {"kept_noise": "multiplier", "s_local": 0.5,
                                    "final_clip_l2": 1.0},
     "kept_noise 'multiplier'"),
    ("topk_kernel", "bisect", {"s_local": 0.5}, "s_local > 0"),
    ("lr_min", 0.001, {"lr_schedule": "cosine"}, "lr_schedule 'cosine'"),
    ("alpha", 0.1, {"partition": "dirichlet_client"}, "partition 'dirichlet' or"),
    ("byzantine_scale", 3.0, {"byzantine_fraction": 0.2}, "byzantine_fraction > 0"),
    ("synthetic_features", 8, {"dataset": "synthetic"}, "dataset 'synthetic'"),
    ("max_cohort", 20, {"sampling": "poisson"}, "sampling 'poisson'"),
    ("server_beta1", 0.8, {"algorithm": "fedadam"}, "server_optimizer 'adam'"),
    ("server_momentum", 0.5, {"server_optimizer": "momentum"}, "server_optimizer 'momentum'"),
    ("tier_noise_multipliers", (1.0,) * 5, dict(DP_ON, clip_parts="tiers", dataset="healthcare"),
     "clip_parts 'tiers' under dp 'central' or 'local'"),
    ("convergence_lambda", 0.5, dict(DP_ON, noise_schedule="convergence"),
     "noise_schedule 'convergence' or 'weighted' under dp"),
    ("convergence_beta", 0.5, dict(DP_ON, noise_schedule="convergence"),
     "noise_schedule 'convergence' under dp"),
    ("analyzer_steps", 100, dict(DP_ON, tier_source="analyzer", dataset="healthcare"),
     "tier_source 'analyzer' under dp"),
    ("client_state_dtype", "bfloat16", {"client_state_store": "host", "algorithm": "scaffold"},
     "client_state_store 'host' or 'disk'"),
])
def test_a_key_nothing_reads_is_refused_and_accepted_where_it_is_read(key, value, enable, reads):
  base = {"partition": "iid"}   # alpha is read by the default partition, dirichlet
  with pytest.raises(ConfigError) as e:
    make_config({**base, key: value})
  assert str(e.value).startswith(f"config key '{key}' = {value!r} is read by nothing in this "
                                 f"run: it is read with {reads}"), str(e.value)
  cfg = make_config({**base, **enable, key: value})
  assert getattr(cfg, key) == value and key not in unread_keys(cfg)
  # the default value is no setting; a saved config holding the key is read as written
  make_config({**base, key: getattr(Config(), key)})
  assert getattr(make_config({**base, key: value}, refuse_unread=False), key) == value


def test_the_command_line_refuses_noise_without_dp_and_writes_nothing(tmp_path):
  out = tmp_path / "run"
  done = subprocess.run([sys.executable, "-m", "fedjax_dp", "run", "--no-progress", "--out",
                         str(out), "--set", "noise_multiplier=1.0", "rounds=1"],
                        capture_output=True, text=True, timeout=120)
  assert done.returncode == 2 and done.stderr == (
      "error: config key 'noise_multiplier' = 1.0 is read by nothing in this run: it is read "
      "with dp 'central' or 'local' (without dp the run has no privacy)\n"), done.stderr
  assert not out.exists()


def test_data_seed_separates_the_data_from_the_run_key():
  # a sweep's seeds share one data split and partition (data_seed) and differ only in
  # the run key; null keeps the old meaning (the data follows seed)
  import jax
  import numpy as np
  from fedjax_dp import recipes
  from fedjax_dp.core.state import init_state
  from fedjax_dp.experiment.setup import client_partition, load_data
  from fedjax_dp.models import make_model
  base = make_config({"num_clients": 6, "clients_per_round": 3, "partition": "dirichlet",
                     "alpha": 0.5})
  ds = load_data(base)
  parts = lambda **kw: client_partition(make_config(kw, base=base), load_data(
      make_config(kw, base=base)))
  same = lambda a, b: all(np.array_equal(x, y) for x, y in zip(a, b))
  assert same(parts(seed=3, data_seed=0), parts(seed=0))
  assert same(parts(seed=3), parts(seed=3, data_seed=3))
  assert not same(parts(seed=3), parts(seed=0))
  model = make_model(base.model, ds.input_shape, ds.output_size, base.hidden)
  def w(**kw):
    cfg = make_config(kw, base=base)
    state = init_state(recipes.run_setup(cfg), recipes.from_config(cfg), model,
                       jax.random.PRNGKey(0))
    return np.asarray(state.params["Dense_0"]["kernel"])
  assert np.array_equal(w(seed=3, data_seed=0), w(seed=3))   # the model follows seed
  assert not np.array_equal(w(seed=3, data_seed=0), w(seed=0, data_seed=0))


def test_the_old_home_of_make_config_says_where_it_went():
  """make_config and load_config left config/ (issue 40: config/ checks each key on its
  own); importing them from there names the new home instead of a bare ImportError."""
  with pytest.raises(ImportError, match="use fedjax_dp.make_config"):
    from fedjax_dp.config import make_config  # noqa: F401
  with pytest.raises(ImportError, match="use fedjax_dp.load_config"):
    from fedjax_dp.config import load_config  # noqa: F401
