"""The run's set-up beside its recipe: who takes part, how each client trains, how
the simulation executes, who attacks. `run_setup(cfg)` reads them from the flat
config once, at the edge (recipes/plan.plan_run), beside `from_config(cfg)`'s
recipe; build_simulation, the round and the state read these records, not the
config.

  Population      num_clients, clients_per_round, sampling, max_cohort
  LocalTraining   epochs, batch_size, the learning-rate schedule's shape and its
                  rounds, the client optimizer's momentum
  Execution       devices, how a device runs its clients, matmul precision, where
                  per-client state lives
  Adversary       the Byzantine clients (who, how, which draw), an audit's canaries,
                  the server's norm bound on each upload
"""

from __future__ import annotations

from typing import NamedTuple

from fedjax_dp.config import Config
from fedjax_dp.config.schema import data_seed
from fedjax_dp.recipes import flat


class Population(NamedTuple):
  num_clients: int
  clients_per_round: int       # the cohort size, or under Poisson sampling its expectation
  sampling: str                # placement/participation.SAMPLINGS
  max_cohort: int | None       # random cohorts' room (None: the default margin)
  min_separation: int | None = None   # sampling cyclic_poisson's groups, min_sep's separation


class LocalTraining(NamedTuple):
  epochs: int
  batch_size: int
  lr_schedule: str             # 'constant' | 'cosine' (over `rounds`)
  rounds: int
  momentum: float              # the client optimizer's momentum (0: none); the round reads
                               # it as data, SCAFFOLD's control-variate step as structure
  server_lr_schedule: str = "constant"   # the server's: 'constant' | 'cosine' (over `rounds`)


class Execution(NamedTuple):
  devices: int
  client_parallelism: str
  client_batch: int            # clients a device runs together (0: the executor's choice)
  matmul_precision: str
  client_state_store: str
  client_state_dtype: str
  client_state_dir: str | None
  local_noise_draw: str = "client"  # local DP: 'client' (each report's own draw) or
                                    # 'aggregate' (the sum's, at once), resolved
                                    # (recipes/flat.local_noise_draw)


class Adversary(NamedTuple):
  byzantine_fraction: float
  byzantine_attack: str
  byzantine_scale: float
  byzantine_draw: str          # 'fixed' (one set of clients) | 'round' (drawn each round)
  canaries: int                # an audit's canary clients (audit_canaries)
  server_clip_l2: float | None  # the server's L2 bound on each upload (None: none)
  data_seed: int               # who is Byzantine or a canary is the data's draw


class RunSetup(NamedTuple):
  population: Population
  training: LocalTraining
  execution: Execution
  adversary: Adversary
  seed: int                    # the model's initialisation
  clip_norm: float             # the mechanism's initial clip norm (its state slot's)
  noise_seed: str              # 'seed' (the run key from the seed) | 'secret' (the OS's)
  model: str                   # the config's model ('custom': the caller's own, whose
                               # programs the release's inputs digest covers)


def run_setup(cfg: Config) -> RunSetup:
  """The set-up `cfg` describes (the recipe is from_config(cfg)'s)."""
  return RunSetup(
      Population(cfg.num_clients, cfg.clients_per_round, cfg.sampling, cfg.max_cohort,
                 cfg.min_separation),
      LocalTraining(cfg.local_epochs, cfg.batch_size, cfg.lr_schedule, cfg.rounds,
                    cfg.momentum, cfg.server_lr_schedule),
      Execution(cfg.devices, cfg.client_parallelism, cfg.client_batch, cfg.matmul_precision,
                cfg.client_state_store, cfg.client_state_dtype, cfg.client_state_dir,
                flat.local_noise_draw(cfg)),
      Adversary(cfg.byzantine_fraction, cfg.byzantine_attack, cfg.byzantine_scale,
                cfg.byzantine_draw, cfg.audit_canaries, cfg.server_clip_l2, data_seed(cfg)),
      cfg.seed, cfg.clip_norm, cfg.noise_seed, cfg.model)
