"""Building a run from a config: data -> partition -> feature scaling -> store -> simulation.

`setup(cfg)` is the Python API's entry point (fedjax_dp.simulate, run_experiment):
it loads the config's dataset (or takes yours), splits it over clients, checks
the model and the loss against it, and builds the compiled simulation.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from fedjax_dp import losses
from fedjax_dp.algorithms import parse_algorithm
from fedjax_dp.config import Config
from fedjax_dp.errors import ConfigError
from fedjax_dp.config.schema import data_seed
from fedjax_dp.core.evaluate import batch_for_eval
from fedjax_dp.core.build import build_simulation
from fedjax_dp.core.simulation import make_mesh
from fedjax_dp.recipes.plan import plan_run
from fedjax_dp.data.dataset import TEST_SOURCES, Dataset, check_targets
from fedjax_dp.errors import DataError
from fedjax_dp.data.natural import select_clients
from fedjax_dp.data.partition import PARTITION_KEYS, partition
from fedjax_dp.data.registry import DATASETS, default_task, load_dataset, natural_datasets
from fedjax_dp.data.scaling import apply_feature_scaling
from fedjax_dp.models import Model, make_model
from fedjax_dp.placement.store import build_store, target_dtype
from fedjax_dp.experiment.reports.privacy_report import resolved_feature_scaling
from fedjax_dp.privacy.mechanisms import get_mechanism
from fedjax_dp.recipes.flat import kept_noise_of


def run_task(cfg: Config, data: Dataset | None = None) -> losses.Task:
  """The task of a run that names none: its data's (registry.default_task: next_token
  for token sequences), else classification."""
  if data is not None:   # a loader's own (natural) data keeps its dataset's task
    return default_task(data.name) if data.client_ids else losses.CLASSIFICATION
  return default_task(cfg.dataset)


def load_data(cfg: Config) -> Dataset:
  """The config's dataset, scaled as far as it can be before partitioning: pooled or
  none; per_client data comes back raw ('none'), for setup to scale per client."""
  if cfg.dataset == "custom":
    raise DataError("dataset 'custom' is your own data: it comes from fedjax_dp.run(data=...) "
                    "or fedjax_dp.simulate(data=...), not from a config (a run made that way "
                    "resumes from Python: fedjax_dp.run(..., resume=True))")
  check_config_test_source(cfg)   # before reading (Stack Overflow pooled: every post)
  options: dict[str, Any] = {}
  if cfg.dataset == "csv":
    options = dict(path=cfg.csv_path, label_column=cfg.label_column, tier_map=cfg.tier_map_path)
  elif cfg.dataset == "synthetic":
    options = dict(num_examples=cfg.synthetic_examples, num_features=cfg.synthetic_features,
                   num_classes=cfg.synthetic_classes)
  elif cfg.dataset == "healthcare":
    options = dict(num_examples=cfg.healthcare_examples, generator=cfg.healthcare_generator)
  elif cfg.dataset == "breast_cancer" and cfg.tier_map_path:
    options = dict(tier_map=cfg.tier_map_path)
  elif cfg.partition == "natural_id" and cfg.dataset in DATASETS \
      and DATASETS[cfg.dataset].reads_chosen:
    options = dict(clients=(cfg.num_clients, cfg.test_clients, data_seed(cfg)))
  mode = resolved_feature_scaling(cfg)
  ds = load_dataset(cfg.dataset, cfg.data_dir, seed=data_seed(cfg),
                    feature_scaling="none" if mode == "per_client" else mode, **options)
  if "clients" in options:   # the loader read only the clients natural_id takes
    ds = dataclasses.replace(ds, clients_taken=clients_taken(cfg))
  return natural_clients(cfg, ds)


def clients_taken(cfg: Config) -> str:
  """How a run takes a dataset's own clients (Dataset.clients_taken)."""
  return f"partition {cfg.partition}" + (
      f", num_clients {cfg.num_clients}, test_clients {cfg.test_clients}, data seed "
      f"{data_seed(cfg)}" if cfg.partition == "natural_id" else "")


def natural_clients(cfg: Config, ds: Dataset) -> Dataset:
  """Data with clients of its own (natural.py) as the run takes it: partition
  'natural_id' keeps test_clients of them whole as the test set and num_clients
  others; any other partition pools their rows for the partitioner (the file's
  test split stays the writers' own held-out rows where it holds them: test_source
  'client_rows'). Taking them again for the same settings returns ds."""
  if not ds.client_ids:
    if cfg.partition == "natural_id":
      raise ConfigError(f"config key 'partition' = 'natural_id' with dataset {cfg.dataset!r}: "
                        "its examples have no clients of their own (allowed with "
                        f"{', '.join(natural_datasets())}, or your own data's clients)")
    return ds
  natural = cfg.partition == "natural_id"
  taken = clients_taken(cfg)
  if ds.clients_taken:
    if ds.clients_taken != taken:
      raise DataError(f"data {ds.name!r}: its clients were taken for {ds.clients_taken}, not "
                      f"{taken}: load it again (load_dataset) for this config")
    return ds
  if natural:
    out = select_clients(ds, cfg.num_clients, cfg.test_clients, data_seed(cfg))[0]
  else:
    out = dataclasses.replace(ds, client_parts=None, test_parts=None)
  return dataclasses.replace(out, clients_taken=taken)


def client_partition(cfg: Config, ds: Dataset) -> list[np.ndarray]:
  """One index array into ds.x_train per client: the data's own clients (partition
  'natural_id', ds from load_data or natural_clients) or the partitioner's split of
  its labels."""
  if cfg.partition == "natural_id":
    return [np.asarray(p) for p in natural_clients(cfg, ds).client_parts]
  return partition(ds.y_train, cfg.num_clients, cfg.partition, seed=data_seed(cfg),
                   **{k: getattr(cfg, k) for k in PARTITION_KEYS})


def setup(cfg: Config, ds: Dataset | None = None, mesh=None, calibrated: float | None = None,
          *, model: Model | None = None, task: losses.Task | None = None):
  """Builds (dataset, partition, simulation) for a config; the Python API's entry point.

  The returned dataset's features are scaled as resolved_feature_scaling(cfg) says
  (per_client: each client's rows with its own statistics, after partitioning); a
  `ds` passed in must come from load_data(cfg) (or load_dataset with that scaling),
  or be your own (data.from_arrays, from_clients: config key dataset 'custom'), whose
  partition it carries. `model`: your own (models.from_flax; config key model
  'custom'); `task`: the loss and metrics (losses.py; default classification).
  The simulation's test_data holds the test set in evaluation batches.
  A run with a privacy guarantee refuses a test set held out of the clients' own
  rows (check_test_source), before anything is built or written.
  `calibrated`: central DP's accounted noise multiplier instead of the one calibrated
  to target_epsilon from round 0 (a resumed run's; recipes/privacy.make_privacy)."""
  task = task or run_task(cfg, ds)
  ds = natural_clients(cfg, ds) if ds is not None else load_data(cfg)
  check_test_source(cfg, ds)
  if not len(ds.y_test):   # metrics of no example would read as 0 accuracy and 0 loss
    raise DataError(f"data {ds.name!r} ({ds.clients_taken or ds.source}): the test set is "
                    "empty" + (" (its test split holds no example of the clients taken); hold "
                               "clients out as the test set: --set partition=natural_id "
                               "test_clients=K (K >= 1)" if ds.client_ids else
                               "; give one (test=(x_test, y_test) or test_fraction)"))
  if cfg.tier_source == "analyzer" and ds.x_train.ndim != 2:
    raise ConfigError(f"config key 'tier_source' = 'analyzer' with dataset {cfg.dataset!r}: the "
                      "analyzer scores the columns of tabular data (use healthcare, "
                      "breast_cancer or csv)")
  if cfg.clip_parts == "tiers" and get_mechanism(cfg.dp).private and ds.feature_tiers is None \
      and cfg.tier_source == "given":
    raise ConfigError(f"config key 'clip_parts' = 'tiers' with dataset {cfg.dataset!r}: the "
                      "data has no sensitivity tiers (use dataset healthcare, or csv or "
                      "breast_cancer with tier_map_path)")
  # labels only: the same under every scaling
  parts = (own_partition(cfg, ds) if ds.client_parts is not None and not ds.client_ids
           else client_partition(cfg, ds))
  ds = apply_feature_scaling(ds, parts, resolved_feature_scaling(cfg))
  check_targets(ds, task.target_dtype, task.name)
  ds, attack_set, poisoned = poison_data(cfg, ds, parts, task)
  if model is None:
    model = builtin_model(cfg, ds)
  elif cfg.model != "custom":
    raise ConfigError(f"a model of your own ({model.name!r}) needs config key model 'custom' "
                      f"(it is {cfg.model!r}): fedjax_dp.run and simulate set it")
  check_model(cfg, model, task, ds)
  x_store, y_store = ds.x_train, ds.y_train
  if poisoned is not None:   # a round draw: the poisoned copy after the clean rows
    x_store, y_store = (np.concatenate([a, b]) for a, b in zip((x_store, y_store), poisoned))
  store = build_store(x_store, y_store, parts, pad_to_multiple=cfg.batch_size,
                      y_dtype=task.target_dtype)
  tiers, analysis, budgets = _tiers_and_budgets(cfg, ds, parts)
  mesh = mesh or make_mesh(cfg.devices)   # (its one-line error before the plan's)
  plan = plan_run(cfg, model, tiers, budgets, calibrated, client_sizes=[len(p) for p in parts])
  sim = build_simulation(plan, model, store, mesh,
                         task=task,
                         poisoned_offset=None if poisoned is None else len(ds.x_train))
  test_data = batch_for_eval(ds.x_test, ds.y_test, cfg.eval_batch_size, task.target_dtype)
  attack_data = (attack_set[0], batch_for_eval(*attack_set[1:], cfg.eval_batch_size,
                                               task.target_dtype)) if attack_set else None
  return ds, parts, dataclasses.replace(sim, analysis=analysis, test_data=test_data,
                                        attack_data=attack_data)


def guarantee_of(cfg: Config) -> str | None:
  """The privacy guarantee a run publishes under ('dp ...' or 'kept_noise ...'), or None."""
  return (f"dp {cfg.dp!r}" if get_mechanism(cfg.dp).private else
          f"kept_noise {cfg.kept_noise!r}" if kept_noise_of(cfg) is not None else None)


def check_config_test_source(cfg: Config) -> None:
  """check_test_source from the config alone, before any data is read (a sweep's
  every cell; load_data): a run with a guarantee on a dataset whose test split holds
  its writers' own held-out rows (registry writers_test_split) tests on them unless
  natural_id holds whole clients out (test_clients >= 1). (Where the clients taken
  have no rows in the test split, the test set would be empty, also refused.)"""
  source = DATASETS.get(cfg.dataset)
  guarantee = guarantee_of(cfg)
  if guarantee is not None and source is not None and source.writers_test_split \
      and not (cfg.partition == "natural_id" and cfg.test_clients > 0):
    raise _writers_rows_error(cfg.dataset, clients_taken(cfg), guarantee)


def _writers_rows_error(name: str, taken: str, guarantee: str) -> DataError:
  return DataError(
      f"dataset {name!r} ({taken}) with {guarantee}: its test split holds held-out examples "
      "of the writers whose examples train, so the published test_loss and test metrics "
      "would be unnoised functions of their data, outside the privacy guarantee; hold whole "
      "clients out as the test set instead: --set partition=natural_id test_clients=K (K >= 1)")


def check_test_source(cfg: Config, ds: Dataset) -> None:
  """DataError (one line) for a test set that is the clients' own rows
  (test_source 'client_rows') in a run with a privacy guarantee (dp 'central' or
  'local', or kept noise): test_loss and the test metrics are published unnoised,
  so they would release those rows outside the guarantee. The report treats the
  test set as public: a loader's split, the caller's test=, or rows held out
  before partitioning."""
  if ds.test_source not in TEST_SOURCES:
    raise DataError(f"data {ds.name!r} has test_source {ds.test_source!r}: allowed are "
                    f"{', '.join(repr(t) for t in TEST_SOURCES)}")
  if ds.test_source != "client_rows":
    return
  guarantee = guarantee_of(cfg)
  if guarantee is None:   # dp none: no guarantee for the holdout to break
    return
  if ds.client_ids:   # a dataset's own clients (natural.py): its test split is theirs
    raise _writers_rows_error(ds.name, ds.clients_taken or "its clients", guarantee)
  raise DataError(
      f"data {ds.name!r} has test_source 'client_rows' (its test set is rows held out of the "
      f"clients' own rows) with {guarantee}: the published test_loss and test metrics would be "
      "unnoised functions of those clients' rows, outside the privacy guarantee; under a "
      "guarantee allowed are test_source 'split' or 'given': pass test=(x_test, y_test) of "
      "data that is no client's, or a partition by name with test_fraction "
      "(from_arrays(x, y, partition='iid', num_clients=..., test_fraction=...): rows held "
      "out before partitioning)")


def poison_data(cfg: Config, ds: Dataset, parts: list[np.ndarray], task: losses.Task):
  """(ds, the attack's test set (name, x, y), the poisoned copy) for a data attack
  (adversary/poisoning.py); else (ds, None, None). byzantine_draw 'fixed': ds holds the
  malicious clients' data poisoned, no copy. 'round': ds stays clean, and the copy
  (x, y) is every client's data poisoned, which the store keeps after the clean
  rows for whichever clients the round draws (attacks.make_data_redraw): twice
  the training data's memory."""
  from fedjax_dp.adversary import attacks, poisoning
  kind = cfg.byzantine_attack
  if cfg.byzantine_fraction <= 0 or kind not in poisoning.DATA_ATTACKS:
    return ds, None, None
  if task != losses.CLASSIFICATION or ds.num_classes < 2:
    raise ConfigError(f"config key 'byzantine_attack' = {kind!r}: data poisoning relabels "
                      "classes, and this run's task is not classification")
  for key in ("attack_source_class", "attack_target_class"):
    if getattr(cfg, key) >= ds.num_classes:
      raise ConfigError(f"config key {key!r} = {getattr(cfg, key)}: dataset {ds.name!r} has "
                        f"{ds.num_classes} classes, allowed are 0 to {ds.num_classes - 1}")
  if kind == "targeted" and cfg.attack_source_class == cfg.attack_target_class:
    raise ConfigError(f"config key 'attack_target_class' = {cfg.attack_target_class}: the "
                      "targeted attack needs a target other than attack_source_class")
  if kind == "backdoor" and ds.x_train.ndim not in (2, 4):
    raise ConfigError(f"config key 'byzantine_attack' = 'backdoor' with inputs {ds.input_shape}: "
                      "the trigger is for images [H, W, C] or rows of features [F]")
  every = cfg.byzantine_draw == "round"
  malicious = (np.ones(cfg.num_clients, bool) if every else
               attacks.malicious_clients(cfg.num_clients, cfg.byzantine_fraction, data_seed(cfg)))
  x, y, _ = poisoning.poison(ds.x_train, ds.y_train, parts, malicious, kind, ds.num_classes,
                             cfg.attack_source_class, cfg.attack_target_class,
                             cfg.backdoor_fraction, data_seed(cfg),
                             trigger=poisoning.trigger_values(ds.x_test))
  attack_set = poisoning.attack_test_set(kind, ds.x_test, ds.y_test,
                                         cfg.attack_source_class, cfg.attack_target_class)
  if every:
    return ds, attack_set, (x, y)
  return dataclasses.replace(ds, x_train=x, y_train=y), attack_set, None


def own_partition(cfg: Config, ds: Dataset) -> list[np.ndarray]:
  """The partition your data carries (data.from_arrays), checked against the config."""
  if cfg.dataset != "custom":
    raise ConfigError(f"data of your own ({ds.name!r}) needs config key dataset 'custom' (it is "
                      f"{cfg.dataset!r}): fedjax_dp.run and simulate set it")
  if len(ds.client_parts) != cfg.num_clients:
    raise ConfigError(f"config key 'num_clients' = {cfg.num_clients}: your data has "
                      f"{len(ds.client_parts)} clients")
  return [np.asarray(p) for p in ds.client_parts]


def builtin_model(cfg: Config, ds: Dataset) -> Model:
  """The config's model for ds: as many outputs as classes (or target coordinates)."""
  if cfg.model == "custom":
    raise ConfigError("config key 'model' = 'custom': your own model is passed to "
                      "fedjax_dp.run(model=...) or simulate(model=...), not named in a config")
  try:
    return make_model(cfg.model, ds.input_shape, ds.output_size, cfg.hidden)
  except ValueError as e:   # inputs the model does not take: "model 'cnn' needs image inputs"
    raise ConfigError(f"config key 'model' = {cfg.model!r} with dataset {cfg.dataset!r}: {e}")


def check_model(cfg: Config, model: Model, task: losses.Task, ds: Dataset) -> None:
  """ConfigError (one line) when the model cannot serve the algorithm or the loss:
  MOON without a representation, SOLO without the classification loss, outputs
  whose shape the loss or its metrics refuse (checked on shapes, before compiling)."""
  terms, _ = parse_algorithm(cfg.algorithm)
  if "moon" in terms and model.apply_with_features is None:
    raise ConfigError(f"algorithm {cfg.algorithm!r} with model {model.name!r}: MOON needs the "
                      "model's representation, and this model has no with_features call (a "
                      "flax module whose __call__(x, with_features=True) returns (outputs, "
                      "representation [B, h]))")
  if "solo" in terms and task != losses.CLASSIFICATION:
    raise ConfigError(f"algorithm 'solo' with loss {task.name!r}: SOLO's evaluation reweights "
                      "the test set to each client's label distribution, which needs the "
                      "classification loss")
  y = ds.y_train
  spec = lambda shape, dtype: jax.ShapeDtypeStruct((2,) + tuple(shape), dtype)
  what = (f"model {model.name!r} with loss {task.name!r} on inputs {ds.input_shape} and "
          f"targets {tuple(y.shape[1:])} {target_dtype(y, task.target_dtype)}")
  try:
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    out = jax.eval_shape(model.apply, params, spec(ds.input_shape, np.float32))
    targets = spec(y.shape[1:], target_dtype(y, task.target_dtype))
    if task.sequence:
      check_sequence_outputs(what, out.shape, y.shape, ds.num_classes, task.token_ids)
    elif task.target_dtype == "int32" and y.ndim > 1:
      raise ConfigError(f"{what}: integer targets {tuple(y.shape[1:])} per example are token "
                        "ids, which the loss does not score: pass "
                        "loss=fedjax_dp.losses.next_token(...)")
    value = jax.eval_shape(task.loss, out, targets, spec((), bool))
    for fn in task.metrics.values():
      jax.eval_shape(fn, out, targets)
  except ConfigError:
    raise
  except Exception as e:   # any error of the user's code, shown on one line
    first = (str(e).strip().splitlines() or [""])[0][:200]
    raise ConfigError(f"{what}: {type(e).__name__}: {first}") from None
  if getattr(value, "shape", None) != ():
    raise ConfigError(f"{what}: the loss returns shape {getattr(value, 'shape', None)}, "
                      "expected a scalar (the mean over the masked rows)")
  if not task.sequence and task.target_dtype == "int32" and (len(out.shape) != 2 or out.shape[1] < ds.num_classes):
    raise ConfigError(f"{what}: outputs of shape {tuple(out.shape[1:])} per example, expected "
                      f"[{ds.num_classes}] logits (labels go up to {ds.num_classes - 1})")


def check_sequence_outputs(what: str, out_shape, y_shape, vocab: int,
                           token_ids: tuple[int, ...] = ()) -> None:
  """ConfigError unless a next_token model's outputs are [B, T, >= vocab] for targets
  [B, T], and every id the task names (pad, ...) is one of its outputs."""
  if len(y_shape) != 2 or tuple(out_shape[1:-1]) != tuple(y_shape[1:]) \
      or out_shape[-1] < vocab:
    raise ConfigError(f"{what}: outputs of shape {tuple(out_shape[1:])} per example, expected "
                      f"{tuple(y_shape[1:]) + (vocab,)} (logits for each position's next "
                      f"token, ids up to {vocab - 1}: model char_lstm_seq, word_lstm, or your "
                      "own sequence model)")
  if token_ids and max(token_ids) >= out_shape[-1]:
    raise ConfigError(f"{what}: the task names token id {max(token_ids)}, and the model has "
                      f"{out_shape[-1]} outputs a position (ids 0 to {out_shape[-1] - 1})")


def _tiers_and_budgets(cfg: Config, ds: Dataset, parts: list[np.ndarray]):
  """(feature tiers, the analyzer's report or None, per-client budgets or None)."""
  tiers, analysis, budgets = ds.feature_tiers, None, None
  client_tiers = np.full(len(parts), 1)   # medium, unless the analyzer says otherwise
  if cfg.tier_source == "analyzer":
    from fedjax_dp.privacy.tiers.analyzer import analyze_clients, thresholds
    out = analyze_clients(ds.x_train, parts, ds.sensitive, ds.feature_tiers, seed=data_seed(cfg),
                          semantic_steps=cfg.analyzer_steps, rule=cfg.analyzer_rule)
    tiers, analysis = out["tiers"], out["report"]
    # a client's own tier: its mean fused score over the scored features
    scored = tiers <= 2
    mean = np.nanmean(np.where(np.isnan(out["client_fused"]), np.nan,
                               out["client_fused"])[:, scored], axis=1)
    client_tiers = np.where(np.isnan(mean), 1, thresholds(np.nan_to_num(mean)))
  if cfg.client_budgets == "allocated":
    from fedjax_dp.privacy.budgets import client_budgets
    budgets = client_budgets(cfg.target_epsilon, [len(p) for p in parts], client_tiers)
    if analysis is not None:
      analysis["client_tier_counts"] = {t: int(np.sum(client_tiers == i))
                                        for i, t in enumerate(("high", "medium", "low"))}
  return tiers, analysis, budgets


def client_label_distribution(ds: Dataset, parts) -> np.ndarray:
  """[clients, classes]: each client's training label frequencies."""
  out = np.zeros((len(parts), ds.num_classes), np.float32)
  for i, idx in enumerate(parts):
    if len(idx):
      out[i] = np.bincount(ds.y_train[idx], minlength=ds.num_classes) / len(idx)
  return out
