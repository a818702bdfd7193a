"""`fedjax_dp.run` and `fedjax_dp.simulate`: your model, loss and data through the simulator.

    import fedjax_dp
    data = fedjax_dp.data.from_arrays(x, y, client_ids=ids, test=(x_test, y_test))
    model = fedjax_dp.models.from_flax(MyModule(), x[:1], name="mine")
    summary = fedjax_dp.run("dp_fedavg", model=model, data=data, loss="mse", rounds=50,
                            out="runs/mine", noise_multiplier=1.0, clients_per_round=5)

`recipe` says which algorithm runs. It is one of
  * a recipe (fedjax_dp.recipes: recipes.fedprox(mu=0.01), recipes.dp_fedavg(...));
    keyword arguments then set the set-up (data, population, model, local
    training, run: recipes.SETUP_KEYS) and may not contradict the recipe;
  * an algorithm name, as the config key `algorithm` takes ('fedavg', 'fedprox',
    'scaffold', 'fedprox+scaffold', ...); 'dp_<name>' is the same with central DP
    (dp 'central': it needs noise_multiplier or target_epsilon);
  * a dict of config keys;
  * a Config (config.make_config).
Keyword arguments are config keys (docs: Config keys) and override a name's,
a dict's or a Config's.
Your data sets the config keys dataset 'custom' and num_clients (its clients);
clients_per_round defaults to min(10, clients) unless given (a Config recipe's
stands). Your model sets model 'custom'.
Without data or model, the config's dataset and model are used as by the CLI.
Every bad input raises one of the CLI's errors (config.ConfigError, data.DataError,
runner.RunError, checkpoint.CheckpointError) with a one-line message.
"""

from __future__ import annotations

from typing import Any, Sequence

from fedjax_dp import losses
from fedjax_dp.config import Config
from fedjax_dp.recipes.config_checks import checked_config
from fedjax_dp.errors import ConfigError
from fedjax_dp.data.dataset import Dataset
from fedjax_dp.models import Model

DEFAULT_COHORT = 10   # Config's clients_per_round default


def recipe_config(recipe, *, model: Model | None = None, data: Dataset | None = None,
                  **overrides) -> Config:
  """The Config that `recipe` and the overrides say, with your model and data in it."""
  from fedjax_dp import recipes
  as_recipe = isinstance(recipe, recipes.Recipe)
  if as_recipe:
    base, values = None, recipe.config_values()
    recipes.base.check_agrees(recipe, values, overrides)
  elif isinstance(recipe, str):
    base, values = None, ({"algorithm": recipe[3:], "dp": "central"} if recipe.startswith("dp_")
                          else {"algorithm": recipe})
  elif isinstance(recipe, dict):
    base, values = None, dict(recipe)
  elif isinstance(recipe, Config):
    base, values = recipe, {}
  else:
    raise ConfigError(f"recipe of type {type(recipe).__name__}: allowed are an algorithm name "
                      "(e.g. 'fedavg', 'dp_fedavg'), a dict of config keys, a Config, or a "
                      "recipe (fedjax_dp.recipes)")
  values.update(overrides)
  if model is not None:
    _own(values, base, "model", model.name)
  if data is not None and data.client_ids:
    # a dataset's own clients (load_dataset('femnist'), ...): the config takes them
    # (partition natural_id: num_clients and test_clients; any other pools them)
    _own(values, base, "dataset", data.name)
  elif data is not None:
    _own(values, base, "dataset", data.name)
    clients = len(data.client_parts) if data.client_parts is not None else None
    if clients is None:
      raise ConfigError(f"data {data.name!r} carries no client partition: build it with "
                        "data.from_arrays or data.from_clients")
    given = values.get("num_clients", base.num_clients if base is not None else clients)
    if given != clients:
      raise ConfigError(f"config key 'num_clients' = {given!r}: your data has {clients} clients")
    values["num_clients"] = clients
    if "clients_per_round" not in values and base is None:
      values["clients_per_round"] = min(DEFAULT_COHORT, clients)
  cfg, built = checked_config(values, base=base)   # (the recipe its checks built)
  return recipes.base.check_expressed(recipe, cfg, built) if as_recipe else cfg


def _own(values: dict, base: Config | None, key: str, name: str) -> None:
  """Sets config key `key` to 'custom' for your own model or data. A clash is an
  error: a value in the overrides, or a Config recipe's value other than the
  default (which it holds whether or not you set it)."""
  given = values.get(key, getattr(base, key) if base is not None else "custom")
  if given not in ("custom", getattr(Config(), key) if key not in values else "custom"):
    raise ConfigError(f"config key {key!r} = {given!r} with your own {key} {name!r}: "
                      f"leave {key!r} out (it becomes 'custom')")
  values[key] = "custom"


def _task(loss):
  """The Task `loss` names; None (no loss given): the data's own (experiment.setup.run_task)."""
  return None if loss is None else losses.get(loss)


def run(recipe: Any = "fedavg", *, out: str, model: Model | None = None,
        data: Dataset | None = None, loss=None, rounds: int | None = None,
        callbacks: Sequence = (), resume: bool = False, overwrite: bool = False,
        progress: bool = True, log=None, **config_overrides) -> dict:
  """Runs a simulation of your model, loss and data into `out`, as `fedjax-dp run` does.

  Writes config.json, metrics.jsonl (one row per evaluation: round, test_<metric>
  for each of the loss's metrics, train_loss, epsilon, bytes, ...), summary.json
  (with the privacy report), plots, checkpoints (checkpoint_every) and inputs.json
  (what your data, model and loss were). A non-empty `out` is never overwritten
  unless `overwrite` (a run folder only); `resume=True` continues the run in `out`
  from its newest checkpoint, bit for bit, with the same recipe, data, model and
  loss (only `rounds` may change). `loss`: a name ('classification', 'mse',
  'mae'), a losses.Task, or a function (outputs, targets, mask) -> scalar;
  default: the dataset's own task (next_token for token datasets), else
  classification. `callbacks`: callbacks.Callback, run after the defaults.
  Returns the summary (summary.json, plus the plots' paths).
  """
  from fedjax_dp.experiment.runner import run_experiment
  task = _task(loss)
  overrides = dict(config_overrides, **({"rounds": rounds} if rounds is not None else {}))
  cfg = recipe_config(recipe, model=model, data=data, **overrides)
  return run_experiment(cfg, out, resume=resume, overwrite=overwrite, progress=progress,
                        log=log, model=model, data=data, task=task, callbacks=callbacks)


def simulate(recipe: Any = "fedavg", *, model: Model | None = None, data: Dataset | None = None,
             loss=None, mesh=None, **config_overrides):
  """The compiled Simulation of your model, loss and data, for driving rounds yourself:

      sim = fedjax_dp.simulate("fedavg", model=model, data=data, loss="mse", rounds=20)
      state = sim.init_state()
      state, stats = sim.run_rounds(state, 5)             # 5 rounds, one compiled scan
      metrics = sim.evaluate(state.params, *sim.test_data)  # {'mse': ..., 'mae': ..., 'loss': ...}

  Writes nothing; the privacy report of a state:
  fedjax_dp.experiment.reports.privacy_report.privacy_report(sim.cfg, sim, state), and
  under local DP every client's epsilon: sim.epsilons(state)[0] ([num_clients])."""
  from fedjax_dp.experiment.setup import setup
  task = _task(loss)
  cfg = recipe_config(recipe, model=model, data=data, **config_overrides)
  _, _, sim = setup(cfg, data, mesh=mesh, model=model, task=task)
  return sim


def sweep(spec: Any, *, out: str, model: Model | None = None, data: Dataset | None = None,
          loss=None, callbacks: Sequence = (), overwrite: bool = False, progress: bool = True,
          replica_batch: int | str | None = None, log=None) -> dict:
  """Runs a sweep into `out`, as `fedjax-dp sweep` does: `spec` is a sweep file's
  path, its contents as a dict ({'base': ..., 'config': {...}, 'seeds': 4,
  'grid': {'lr': [...]}, 'variants': [...]}; sweeps/spec.py) or a SweepSpec.

  Writes each cell's run folder (out/cells/<name>/), the tidy table
  (results.csv, results.parquet: one row per cell x evaluation), final.csv (mean
  and sd over seeds per setting) and plots of mean +- sd over seeds. Run again
  into the same `out`, it keeps finished cells and continues the others.
  Your `model`, `data` and `loss` are every cell's (config keys model and dataset
  'custom', num_clients your data's, clients_per_round min(10, clients) unless
  given). `replica_batch` overrides the spec's. Returns sweep.json's contents.
  """
  import dataclasses as _dc
  from fedjax_dp.sweeps import SweepSpec, load_sweep, run_sweep
  from fedjax_dp.sweeps.spec import replica_batch_value
  spec = spec if isinstance(spec, SweepSpec) else load_sweep(spec)
  base = dict(spec.base)
  if model is not None:
    _own(base, None, "model", model.name)
  if data is not None and data.client_ids:
    # a dataset's own clients: the spec's partition, num_clients and test_clients take them
    _own(base, None, "dataset", data.name)
  elif data is not None:
    _own(base, None, "dataset", data.name)
    if data.client_parts is None:
      raise ConfigError(f"data {data.name!r} carries no client partition: build it with "
                        "data.from_arrays or data.from_clients")
    clients = len(data.client_parts)
    if base.get("num_clients", clients) != clients:
      raise ConfigError(f"config key 'num_clients' = {base['num_clients']!r}: your data has "
                        f"{clients} clients")
    base["num_clients"] = clients
    base.setdefault("clients_per_round", min(DEFAULT_COHORT, clients))
  spec = _dc.replace(spec, base=base, replica_batch=spec.replica_batch if replica_batch is None
                     else replica_batch_value(replica_batch))
  return run_sweep(spec, out, overwrite=overwrite, progress=progress, log=log, model=model,
                   data=data, task=_task(loss), callbacks=callbacks)


def profile(recipe: Any = "fedavg", *, out: str, rounds: int = 5, model: Model | None = None,
            data: Dataset | None = None, loss=None, **config_overrides) -> dict:
  """`fedjax-dp profile` from Python: traces a compiled chunk of `rounds` rounds of the
  run `recipe` and the keywords say (as fedjax_dp.run takes them) with jax.profiler
  into `out` (a new or empty folder; Perfetto, TensorBoard), and writes ops.csv and
  profile.json. Returns profile.json's contents plus 'rows': every compiled
  operation, most self time first (op, count, self_ms, total_ms, share, source)."""
  from fedjax_dp.experiment.profile import profile_rounds
  if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
    raise ConfigError(f"rounds = {rounds!r}: allowed are whole numbers >= 1")
  cfg = recipe_config(recipe, model=model, data=data, **config_overrides)
  return profile_rounds(cfg, rounds, out, model=model, data=data, task=_task(loss))

