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


# module name -> SHA-256 (hex) of the source it was imported from: the code that runs,
# which a file edited after its import no longer is (plugin_digest reads this first)
_IMPORTED: dict[str, str] = {}


def module_name(plugin: str) -> str:
  """The module a plugin is imported as: a file's, named after its resolved path."""
  if not plugin.endswith(".py"):
    return plugin
  return "fedjax_dp_plugin_" + hashlib.sha256(os.path.realpath(plugin).encode()).hexdigest()[:16]


def imported_digest(plugin: str) -> str | None:
  """SHA-256 of the source `plugin` was imported from in this process, or None where
  it is not imported (or was taken out of sys.modules since)."""
  name = module_name(plugin)
  return _IMPORTED.get(name) if name in sys.modules else None


def load_plugins(plugins: tuple[str, ...], named: str = "config key 'plugins'") -> None:
  """Imports each of `plugins`; ConfigError naming the one that fails and why (as
  `named` gave it: the config key, or a command's --plugins)."""
  for plugin in plugins:
    try:
      if plugin.endswith(".py"):
        _import_file(plugin, named)
      else:
        _import_module(plugin)
    except ConfigError:
      raise
    except Exception as e:   # the user's code: any error it raises, in one line
      raise ConfigError(f"{named} = {plugin!r}: importing it raised "
                        f"{type(e).__name__}: {e}") from e


def _import_file(path: str, named: str) -> None:
  full = os.path.realpath(path)
  if not os.path.isfile(full):
    raise ConfigError(f"{named} = {path!r}: no such file (from {os.getcwd()})")
  name = module_name(path)
  if name in sys.modules:
    return
  with open(full, "rb") as f:
    source = f.read()   # the bytes that run are the bytes hashed
  spec = importlib.util.spec_from_file_location(name, full)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  try:
    exec(compile(source, full, "exec"), module.__dict__)
  except BaseException:
    del sys.modules[name]   # a failed import is not half-registered as done
    raise
  _IMPORTED[name] = hashlib.sha256(source).hexdigest()


def _import_module(name: str) -> None:
  module = importlib.import_module(name)
  path = getattr(module, "__file__", None)
  if name not in _IMPORTED and path and os.path.isfile(path):
    with open(path, "rb") as f:
      _IMPORTED[name] = hashlib.sha256(f.read()).hexdigest()
