"""fedjax-dp: a JAX simulator for private, communication-efficient, robust federated learning.

Public API (each name is imported on first use, so `import fedjax_dp` stays cheap):

  recipes                 the algorithms as recipes of stages: fedavg(), fedprox(mu=),
                          dp_fedavg(noise_multiplier=), ...; Recipe, compose, from_config
  run(recipe, model=, data=, loss=, rounds=, out=, callbacks=, **config)
                          a whole run with the CLI's outputs: metrics.jsonl, summary.json
                          with the privacy report, plots, checkpoints, resume
  sweep(spec, out=, model=, data=, loss=)
                          a sweep file's (or dict's) cells as replicas of as few compiled
                          programs as can be: each cell's run folder, the tidy table
                          (CSV, Parquet), means over seeds and their plots
  profile(recipe, out=, rounds=, **config)
                          a jax.profiler trace of compiled rounds and their top operations
  compare(*paths)         runs and sweeps side by side: a row a run with final and best
                          metrics, epsilon, bytes, time and the config keys that differ
  load_params(run_dir)    the trained parameters a run saved (model.msgpack)
  attack_mia(run_dir, examples=, seed=, data=, model=)
                          membership inference (loss threshold) on a run's model: accuracy,
                          AUC, TPR at 1 % FPR beside the bound the run's epsilon allows
  attack_attribute(run_dir, feature=, examples=, seed=, data=, model=)
                          attribute inference of a sensitive tabular column on a run's model
  audit(config, out=, canaries=, held_out=, bootstrap=, all_iterates=, confidence=)
                          a run with canary clients: the one-shot empirical epsilon
                          (with its 95 % interval) and the one-run lower bounds at
                          `confidence`, beside the accounted one
  audit_runs(config, out=, runs=, confidence=)
                          the multi-run audit of a tiny model: an epsilon lower bound
                          with its confidence, beside the accounted one
  simulate(recipe, model=, data=, loss=, **config)
                          the compiled Simulation (init_state, run_rounds, evaluate)
  models                  from_flax(module, example_input, name=) and the built-in models
  data                    from_arrays(x, y, ...), from_clients([(x_i, y_i), ...]), Dataset
  losses                  Task, classification(), regression('mse' | 'mae'), from_loss(fn), next_token(...)
  callbacks               Callback(on_run_start, after_chunk, on_run_end), RunContext,
                          log_metrics(*writers)
  writers                 live metrics writers: csv(out), tensorboard(out), MetricsWriter
  Config, make_config     the flat run configuration (README: Config keys)
  ConfigError, DataError, RunError
                          the one-line errors of bad input
  start_processes(num_processes, process_id, coordinator)
                          join a run of many processes (hosts) before JAX starts:
                          the clients axis spans them all, process 0 writes --out

`recipe` is a recipe (fedjax_dp.recipes), an algorithm name ('fedavg'; 'dp_fedavg'
for central DP), a dict of config keys, or a Config (see fedjax_dp.api).
"""

import importlib

__version__ = "0.1.0"

# public module name -> where it lives (the layout: README, Architecture)
_SUBMODULES = {"api": "api", "callbacks": "callbacks", "config": "config", "data": "data",
               "losses": "losses", "models": "models", "recipes": "recipes",
               "runner": "experiment.runner", "sweeps": "sweeps",
               "writers": "experiment.writers"}
_NAMES = {"run": "api", "simulate": "api", "sweep": "api", "profile": "api", "Config": "config",
          "make_config": "recipes.config_checks", "load_config": "recipes.config_checks",
          "compare": "experiment.compare",
          "ConfigError": "errors", "DataError": "errors", "RunError": "errors",
          "start_processes": "placement.processes", "load_params": "experiment.final_model",
          "attack_mia": "experiment.attack",
          "attack_attribute": "experiment.attack", "audit": "experiment.audit_run",
          "audit_runs": "experiment.audit_run"}
__all__ = sorted(tuple(_SUBMODULES) + tuple(_NAMES))


def __getattr__(name: str):
  if name in _SUBMODULES:
    return importlib.import_module(f"{__name__}.{_SUBMODULES[name]}")
  if name in _NAMES:
    return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
  return sorted(set(globals()) | set(__all__))
