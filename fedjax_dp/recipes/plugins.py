"""The config's `plugins`: the user's Python files or modules, imported once before
the config is checked, so that the stages they register (a term, a rule, a
mechanism, a dataset) are names the config may use, in every command that reads
the config (run, sweep, resume, compare, attack), since config.json keeps the list.

A file is imported as a module named after its resolved path (so a second import
of the same file is the first one, and its registrations are not repeated); a
module name goes through importlib. A relative path is taken from the working
directory, as the CLI's other paths are.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys

from fedjax_dp.errors import ConfigError


def load_plugins(plugins: tuple[str, ...]) -> None:
  """Imports each of `plugins`; ConfigError naming the one that fails and why."""
  for plugin in plugins:
    try:
      if plugin.endswith(".py"):
        _import_file(plugin)
      else:
        importlib.import_module(plugin)
    except ConfigError:
      raise
    except Exception as e:   # the user's code: any error it raises, in one line
      raise ConfigError(f"config key 'plugins' = {plugin!r}: importing it raised "
                        f"{type(e).__name__}: {e}") from e


def _import_file(path: str) -> None:
  full = os.path.realpath(path)
  if not os.path.isfile(full):
    raise ConfigError(f"config key 'plugins' = {path!r}: no such file (from "
                      f"{os.getcwd()})")
  name = "fedjax_dp_plugin_" + hashlib.sha256(full.encode()).hexdigest()[:16]
  if name in sys.modules:
    return
  spec = importlib.util.spec_from_file_location(name, full)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  try:
    spec.loader.exec_module(module)
  except BaseException:
    del sys.modules[name]   # a failed import is not half-registered as done
    raise
