"""The run's set-up beside its recipe: who takes part, how each client trains, how
the simulation executes. `run_setup(cfg)` reads them from the flat config once,
at the edge (build_simulation), beside `from_config(cfg)`'s recipe; the round
and the state below read these records, not the config.

  Population      num_clients, clients_per_round, sampling, max_cohort
  LocalTraining   epochs, batch_size, the learning-rate schedule's shape and its
                  rounds, the client optimizer's momentum
  Execution       devices, how a device runs its clients, matmul precision, where
                  per-client state lives
"""

from __future__ import annotations

from typing import NamedTuple

from fedjax_dp.config import Config


class Population(NamedTuple):
  num_clients: int
  clients_per_round: int       # the cohort size, or under Poisson sampling its expectation
  sampling: str                # 'fixed' | 'poisson'
  max_cohort: int | None       # Poisson draws' room (None: the default margin)


class LocalTraining(NamedTuple):
  epochs: int
  batch_size: int
  lr_schedule: str             # 'constant' | 'cosine' (over `rounds`)
  rounds: int
  momentum: float              # the client optimizer's momentum (0: none); the round reads
                               # it as data, SCAFFOLD's control-variate step as structure


class Execution(NamedTuple):
  devices: int
  client_parallelism: str
  client_batch: int            # clients a device runs together (0: the executor's choice)
  matmul_precision: str
  client_state_store: str
  client_state_dtype: str
  client_state_dir: str | None


class RunSetup(NamedTuple):
  population: Population
  training: LocalTraining
  execution: Execution
  seed: int                    # the model's initialisation
  clip_norm: float             # the mechanism's initial clip norm (its state slot's)


def run_setup(cfg: Config) -> RunSetup:
  """The set-up `cfg` describes (the recipe is from_config(cfg)'s)."""
  return RunSetup(
      Population(cfg.num_clients, cfg.clients_per_round, cfg.sampling, cfg.max_cohort),
      LocalTraining(cfg.local_epochs, cfg.batch_size, cfg.lr_schedule, cfg.rounds,
                    cfg.momentum),
      Execution(cfg.devices, cfg.client_parallelism, cfg.client_batch, cfg.matmul_precision,
                cfg.client_state_store, cfg.client_state_dtype, cfg.client_state_dir),
      cfg.seed, cfg.clip_norm)
