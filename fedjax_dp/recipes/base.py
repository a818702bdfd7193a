"""A recipe: the stage choices of a run, as plain data.

A `Recipe` is what an algorithm is: its local terms, the client upload stages,
the shuffler, the aggregation rule, the server stages, the server optimizer and
the privacy mechanism (with its noise planner, adaptive clipping and per-client
budgets). Each slot holds a `Choice`: the stage module's own object (a
algorithms.LocalTerm, a robust.Aggregator, a pipeline.ClientStage, a
server_stages.ServerStageSpec, a privacy.mechanisms.Mechanism, ...), whose static fields
are the properties `validate` reads, and the flat Config keys it stands for.

What is not a recipe is the set-up (`SETUP_KEYS`): the data and its clients,
the model, local training, Byzantine clients, how long and on what it runs.
Local training (lr, epochs, batch, momentum) is set-up rather than recipe
because it is tuned per data set and model like the data's own keys, and a
recipe object then runs unchanged on any of them (fedjax_dp.run(recipe,
lr=...) is allowed; changing a recipe's own key is refused as a contradiction).
`Recipe.to_config(**setup)` and `recipes.from_config(cfg)` translate between a
recipe and the flat Config, which stays the CLI / YAML / config.json format.

Why a choice holds the stage object and its config keys, not just one of them:
the object is what runs and what its properties come from (a rule registered
with linear=False is refused with central DP without a line here); the keys
let a recipe written in Python become the config.json of its run, and let a
run read from its config.json be shown and compared as a recipe.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Callable, Mapping, NamedTuple

from fedjax_dp.config import Config
from fedjax_dp.config.keys import KEYS
from fedjax_dp.config.plugin_keys import PLUGIN_FIELD
from fedjax_dp.config.schema import config_of
from fedjax_dp.errors import ConfigError

# Config keys of the set-up, not of the algorithm: recipes leave them to the caller.
# They are the keys that feed no stage of a recipe (config/keys.py `feeds`): the data,
# the population and its sampling, the model and local training, Byzantine clients
# and an audit's canaries, the run and its execution, the plugins.
SETUP_KEYS = frozenset(k.name for k in KEYS if not k.feeds)
RECIPE_KEYS = tuple(f.name for f in dataclasses.fields(Config)
                    if f.name not in SETUP_KEYS and f.name != PLUGIN_FIELD)
_DEFAULTS = {f.name: getattr(Config(), f.name) for f in dataclasses.fields(Config)}


_SINGLE_SLOTS = ("shuffle", "aggregator", "server_optimizer", "privacy", "planner",
                 "adaptive_clip", "budgets")


class Choice(NamedTuple):
  """One stage of a recipe: its module's object and the config keys it stands for."""
  stage: Any
  config: Mapping[str, Any] = types.MappingProxyType({})


@dataclasses.dataclass(frozen=True, eq=True)
class Recipe:
  """The stage choices of a run (see the module docstring). Build one with the
  named recipes (recipes.fedavg(), ...) or `compose`; `from_config` reads one
  from a Config."""
  name: str
  algorithm: str                            # the config's 'algorithm': its terms' name
  terms: tuple[Choice, ...] = ()            # LocalTerm choices, in registry order
  upload: tuple[Choice, ...] = ()           # pipeline.ClientStage choices, in order
  shuffle: Choice | None = None             # pipeline.Shuffler
  aggregator: Choice | None = None          # robust.Aggregator (None: the weighted mean)
  server: tuple[Choice, ...] = ()           # server_stages.ServerStageSpec choices, in order
  server_optimizer: Choice | None = None    # stage: 'sgd' | 'momentum' | 'adam'
  privacy: Choice | None = None             # privacy.mechanisms.Mechanism (None: no DP)
  planner: Choice | None = None             # noise_control.Planner
  adaptive_clip: Choice | None = None       # dp_round.AdaptiveClipping
  budgets: Choice | None = None             # budgets.Allocation
  # flat config values of keys no stage here reads (from_config keeps them so a
  # config round-trips; they change nothing)
  unused: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  # ------------------------------------------------------------------ the flat config
  def slots(self) -> list[tuple[str, Choice]]:
    """(slot, choice) of every stage: the tuple slots in order, then the single ones."""
    many = [(slot, c) for slot in ("terms", "upload", "server") for c in getattr(self, slot)]
    return many + [(slot, getattr(self, slot)) for slot in _SINGLE_SLOTS
                   if getattr(self, slot) is not None]

  def choices(self) -> tuple[Choice, ...]:
    return tuple(c for _, c in self.slots())

  def config_values(self) -> dict[str, Any]:
    """Every recipe key (RECIPE_KEYS) of the flat config: the stages' values, the
    unused ones, and the defaults of stages the recipe does not have."""
    values = {k: _DEFAULTS[k] for k in RECIPE_KEYS}
    values.update(self.unused)
    values["algorithm"] = self.algorithm
    owner: dict[str, str] = {}
    for choice in self.choices():
      for key, value in choice.config.items():
        if key in owner and values[key] != value:
          raise ConfigError(f"recipe {self.name!r}: config key {key!r} is {values[key]!r} for "
                            f"{owner[key]} but {value!r} for {_name(choice.stage)}")
        owner[key] = _name(choice.stage)
        values[key] = value
    return values

  def to_config(self, base: Config | None = None, **setup) -> Config:
    """The validated flat Config of this recipe with the set-up keys `setup` (on
    `base`'s set-up, or the defaults). A recipe key in `setup` must agree with
    the recipe (else a one-line ConfigError)."""
    values = self.config_values()
    check_agrees(self, values, setup)
    from fedjax_dp.recipes.config_checks import checked_config
    start = {k: v for k, v in (base or Config()).to_dict().items() if k in SETUP_KEYS}
    # a recipe read from a config that holds unread keys (a saved run's, accepted when
    # it was written) gives that config back; a recipe built from stages has none
    cfg, built = checked_config({**start, **values, **setup}, refuse_unread=not self.unused)
    return check_expressed(self, cfg, built)

  # ------------------------------------------------------------------ resolved stages
  def objective(self, data_loss: Callable | None = None, momentum: float = 0.0):
    """The clients' objective: the task loss plus the terms (algorithms.Objective).
    `momentum`: the client optimizer's (SCAFFOLD's step count)."""
    from fedjax_dp.algorithms import objective as objective_lib
    extra = {} if data_loss is None else {"data_loss": data_loss}
    return objective_lib.of_terms([c.stage for c in self.terms], momentum, **extra)

  @property
  def rule(self):
    """The aggregation rule (robust.Aggregator)."""
    from fedjax_dp import robust
    return self.aggregator.stage if self.aggregator is not None else robust.get_aggregator("mean")

  def rule_hparams(self) -> dict:
    return dict(self.rule.hparams)

  def client_pipeline(self):
    """The upload stages chained (pipeline.ClientStage), or None without any."""
    from fedjax_dp.compression import pipeline
    return pipeline.chain(*(c.stage for c in self.upload)) if self.upload else None

  def server_stages(self, num_clients: int, key_tag: int):
    """The server stages for `num_clients` (server_stages.chain); the DP mechanism
    brings its noise controller. `key_tag`: the downlink top-k's key tag."""
    from fedjax_dp.training import server_stages as lib
    stages = [c.stage.build(num_clients, key_tag) for c in self.server]
    if self.privacy is not None:
      p = self.planner.config if self.planner is not None else _DEFAULTS
      stages.append(lib.noise_controller(p["noise_schedule"], p["convergence_measure"],
                                         p["convergence_window"], num_clients))
    return lib.chain(*stages)

  def server_optimizer_fn(self, lr=None, momentum=None):
    """The server optimizer (optax); `lr` and `momentum` (default: the recipe's)
    may be traced arrays."""
    from fedjax_dp.training import server
    c = self.server_optimizer.config if self.server_optimizer is not None else _DEFAULTS
    kind = self.server_optimizer.stage if self.server_optimizer is not None else "sgd"
    return server.make_optimizer(kind, c["server_lr"] if lr is None else lr,
                                 c["server_momentum"] if momentum is None else momentum,
                                 c["server_beta1"], c["server_beta2"], c["server_eps"])

  # ------------------------------------------------------------------ checks
  def validate(self) -> "Recipe":
    """Raises ConfigError (one line) for a combination of stages no guarantee or
    rule covers, judged from the stages' static properties; returns self."""
    from fedjax_dp.recipes.validate import first_problem
    problem = first_problem(self)
    if problem:
      raise ConfigError(problem)
    return self

  def replace(self, **changes) -> "Recipe":
    return dataclasses.replace(self, **changes)


def check_expressed(recipe: Recipe, cfg: Config, rebuilt: Recipe | None = None) -> Config:
  """cfg, or a ConfigError where cfg's recipe (the one a run builds; `rebuilt`, where
  the config's checks already built it) has other stages than `recipe`: a stage the
  config has no key for would be dropped without a word."""
  from fedjax_dp.recipes.flat import from_config
  rebuilt = from_config(cfg) if rebuilt is None else rebuilt
  built = outline(rebuilt)
  if built != outline(recipe):
    raise ConfigError(f"recipe {recipe.name!r}: its stages {outline(recipe)} are not what its "
                      f"config keys give {built}; a stage without config keys must be "
                      "registered (docs: Extend)")
  if numbers(rebuilt) != numbers(recipe):
    # a registered stage built with a number no config key feeds would run at its
    # constructor's default: refused rather than changed without a word
    raise ConfigError(f"recipe {recipe.name!r}: its stages' numbers {numbers(recipe)} are not "
                      f"what its config keys give {numbers(rebuilt)}; a number needs a config "
                      "key that feeds it (config/keys.py; docs: Extend)")
  return cfg


def numbers(recipe: Recipe) -> dict[str, dict]:
  """The local terms' and the aggregation rule's numbers, by stage name."""
  return {**{c.stage.name: dict(c.stage.hparams) for c in recipe.terms},
          recipe.rule.name: dict(recipe.rule.hparams)}


def outline(recipe: Recipe) -> dict[str, Any]:
  """Which stages a recipe has, by slot (names only; a mechanism's static planner
  is the same as none)."""
  one = lambda c: None if c is None else _name(c.stage)
  planner = one(recipe.planner)
  return {"terms": [one(c) for c in recipe.terms], "upload": [one(c) for c in recipe.upload],
          "shuffle": one(recipe.shuffle), "aggregator": _name(recipe.rule),
          "server": [one(c) for c in recipe.server],
          "server_optimizer": one(recipe.server_optimizer) or "sgd",
          "privacy": one(recipe.privacy), "planner": None if planner == "static" else planner,
          "adaptive_clip": one(recipe.adaptive_clip), "budgets": one(recipe.budgets)}


def _name(stage) -> str:
  return stage if isinstance(stage, str) else getattr(stage, "name", type(stage).__name__)


def check_agrees(recipe: Recipe, values: Mapping[str, Any], overrides: Mapping[str, Any]) -> None:
  """Raises ConfigError where `overrides` set a recipe key to something else than
  the recipe's `values` (run(recipes.fedprox(mu=0.1), algorithm='scaffold'))."""
  from fedjax_dp.config import _coerce
  for key, value in overrides.items():
    if key in values and key not in SETUP_KEYS:
      try:
        same = _coerce(key, value) == values[key]
      except ConfigError:
        same = False
      if not same:
        raise ConfigError(f"config key {key!r} = {value!r} contradicts recipe {recipe.name!r} "
                          f"({key} {values[key]!r}): change the recipe (e.g. "
                          f"recipes.{recipe.name}(...)) rather than override it")


_ORDER = ("terms", "upload", "shuffle", "aggregator", "server", "server_optimizer", "privacy",
          "planner", "adaptive_clip", "budgets")


def compose(name: str, *parts, algorithm: str | None = None) -> Recipe:
  """A recipe from (slot, choice) pairs or lists of them (recipes.stages), e.g.
  compose('fedprox', term('fedprox', prox_mu=0.1), sgd(1.0)): the tuple slots
  (terms, upload, server) collect in order (terms then sorted into registry
  order), the others take one choice each. `algorithm` (default: the terms'
  names joined by '+', or 'fedavg') is the config's name for the terms; a server
  optimizer the algorithm implies is written as 'auto'."""
  from fedjax_dp.algorithms import registry
  fields: dict[str, Any] = {"terms": [], "upload": [], "server": []}
  slots = [s for p in parts for s in (p if isinstance(p, list) else [p])]
  for slot, choice in slots:
    if slot not in _ORDER:
      raise ValueError(f"recipe slot {slot!r}: allowed are {', '.join(_ORDER)}")
    if slot in fields and isinstance(fields[slot], list):
      fields[slot].append(choice)
    elif slot in fields:
      raise ValueError(f"recipe {name!r}: two choices for slot {slot!r}")
    else:
      fields[slot] = choice
  order = list(registry.TERMS)
  terms = sorted(fields.pop("terms"), key=lambda c: order.index(c.stage.name)
                 if c.stage.name in order else len(order))
  algorithm = algorithm or "+".join(c.stage.name for c in terms) or "fedavg"
  opt = fields.get("server_optimizer")
  if opt is not None and registry.parse_algorithm(algorithm)[1] == opt.stage:
    fields["server_optimizer"] = opt._replace(config={**opt.config, "server_optimizer": "auto"})
  recipe = Recipe(name=name, algorithm=algorithm, terms=tuple(terms),
                  upload=tuple(fields.pop("upload")), server=tuple(fields.pop("server")),
                  **fields)
  return _resolve_draw(recipe)


def _resolve_draw(recipe: Recipe) -> Recipe:
  """The kept-noise stage rebuilt where its draw is 'auto': whether the server may
  draw the aggregate's noise depends on the recipe's mechanism and rule, known
  only once the recipe is whole (from_config resolves it from the whole config)."""
  if not any(c.config.get("kept_noise_draw") == "auto" for c in recipe.upload):
    return recipe
  from fedjax_dp.recipes.flat import upload_choices
  namespace = config_of(recipe.config_values())
  rebuilt = {c.stage.name: c for c in upload_choices(namespace)}
  return recipe.replace(upload=tuple(rebuilt[c.stage.name] if "kept_noise_draw" in c.config
                                     else c for c in recipe.upload))
