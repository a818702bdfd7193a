"""Algorithms as recipes: the stage choices of a run, composed as optax composes an optimizer.

    from fedjax_dp import recipes
    r = recipes.fedprox(mu=0.01)                  # FedProx: the fedprox term + sgd server
    r = recipes.dp_fedavg(noise_multiplier=1.0, clip_norm=0.5)
    cfg = r.to_config(dataset="digits", rounds=30)   # the flat Config (config.json)
    recipes.from_config(cfg)                       # and back

  base.py       Recipe, Choice, compose; SETUP_KEYS (the config keys that are not
                the algorithm's: data, population, model, local training, run)
  stages.py     the building blocks: term, sgd / momentum / adam, aggregator, upload,
                shuffle, downlink_topk, central_dp / local_dp, noise_schedule, ...
  catalogue.py  the named recipes (NAMED): fedavg, fedavgm, fedadam, fedprox,
                scaffold, moon, fedadmm, feddyn, contrastive, topksdp, solo,
                dp_fedavg (central DP), ldp_fedavg (local DP), dynamic_dp, dp_ftrl
                (correlated noise)
  flat.py       from_config: a Config read as a recipe (the run's; build_simulation)
  serial.py     to_dict / from_dict: a recipe as registered names and keyword arguments
  setup.py      run_setup: the rest of the run (Population, LocalTraining, Execution,
                Adversary)
  plan.py       plan_run: the config read once into what build_simulation compiles
                (recipe, set-up, privacy, the round's numbers); replan / reseeded:
                the same round with numbers or the seed changed
  privacy.py    make_privacy: the config's DP keys read into the round's Privacy
                (calibration to target_epsilon, the accounted event)
  release_identity.py  the run key: the seed with the release's settings and inputs
  hparams.py    round_hparams: the numbers the compiled round reads as data, from the
                config's numeric keys (NUMERIC_KEYS), and what a change of them may not do
  validate.py   the combination rules, over the stages' static properties
  config_checks.py  make_config / load_config: a Config checked against the run's
                stages (config/ checks each key on its own)

A run is always built from its config's recipe (`from_config`), so config.json
reproduces it; `to_config` refuses a recipe whose stages its keys cannot express.
"""

from fedjax_dp.recipes.base import RECIPE_KEYS, SETUP_KEYS, Choice, Recipe, compose
from fedjax_dp.recipes.catalogue import (NAMED, contrastive, dp_fedavg, dp_ftrl, dynamic_dp,
                                         fedadam, fedadmm, fedavg, fedavgm, feddyn, fedprox,
                                         ldp_fedavg, moon, scaffold, solo, topksdp)
from fedjax_dp.recipes.flat import from_config
from fedjax_dp.recipes.serial import from_dict, to_dict
from fedjax_dp.recipes.setup import (Adversary, Execution, LocalTraining, Population, RunSetup,
                                     run_setup)
from fedjax_dp.recipes.plan import RunPlan, plan_run
from fedjax_dp.recipes import stages
