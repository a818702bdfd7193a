"""The package's layers, held (issue 40): no import cycle between folders and no
import that climbs, function-level imports included.

A folder (or a top-level module) sits in one layer; a module may import from its
own layer's folders and from lower layers. CLIMBING lists exceptions edge by edge
(none since issue 40 moved the report code out of privacy/ and made config/ a
leaf): the test fails on a climbing import not listed, on a listed one that is
gone (so the list only shrinks), and on any cycle between folders.
"""

from __future__ import annotations

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# lowest first; "kernels" is the top-level kernels/ (installed as fedjax_dp.kernels)
LAYERS = (
    ("errors.py", "config/", "kernels/", "stage.py"),
    ("placement/", "data/", "models/", "losses.py"),
    ("algorithms/", "robust/", "adversary/", "compression/", "privacy/", "training/"),
    ("recipes/",),
    ("core/",),
    ("experiment/", "sweeps/", "callbacks.py"),
    ("api.py", "cli/", "__init__.py", "__main__.py"),
)
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def modules() -> dict[str, str]:
  """{dotted module name: file} of fedjax_dp and kernels/."""
  out = {}
  for root in ("fedjax_dp", "kernels"):
    for d, _, files in os.walk(os.path.join(ROOT, root)):
      for f in files:
        if f.endswith(".py"):
          path = os.path.join(d, f)
          rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
          name = ("fedjax_dp." if root == "kernels" else "") + rel
          out[name.removesuffix(".__init__")] = path
  return out


def import_edges() -> dict[str, set[str]]:
  """{module: the package modules it imports anywhere in its file}."""
  mods = modules()

  def resolve(name):
    while name and name not in mods:
      name = name.rpartition(".")[0]
    return name or None

  edges = {}
  for m, path in mods.items():
    pkg = m if path.endswith("__init__.py") else m.rpartition(".")[0]
    targets = set()
    with open(path) as f:
      tree = ast.parse(f.read())
    for n in ast.walk(tree):
      if isinstance(n, ast.Import):
        names = [a.name for a in n.names]
      elif isinstance(n, ast.ImportFrom):
        base = n.module or ""
        if n.level:
          parts = pkg.split(".")
          base = ".".join(parts[:len(parts) - n.level + 1] + ([base] if base else []))
        names = [f"{base}.{a.name}" for a in n.names]
      else:
        continue
      targets |= {t for t in map(resolve, names) if t and t != m}
    edges[m] = targets
  return edges


def unit(module: str, mods: dict[str, str]) -> str:
  """The folder ("privacy/") or top-level module ("losses.py") a module belongs to."""
  parts = module.split(".")
  if len(parts) == 1:
    return "__init__.py"
  if len(parts) > 2 or mods[module].endswith("__init__.py"):
    return parts[1] + "/"
  return parts[1] + ".py"


def climbing_edges() -> set[tuple[str, str]]:
  mods, edges = modules(), import_edges()
  return {(a, b) for a, bs in edges.items() for b in bs
          if RANK[unit(b, mods)] > RANK[unit(a, mods)]}


def folder_cycles(skip: set[tuple[str, str]], edges=None) -> list[list[str]]:
  """Strongly connected groups of folders, over the imports not in `skip` (`edges`:
  {module: imported modules}, the package's by default)."""
  mods = modules()
  edges = import_edges() if edges is None else edges
  graph: dict[str, set[str]] = {}
  for a, bs in edges.items():
    for b in bs:
      if (a, b) not in skip and unit(a, mods) != unit(b, mods):
        graph.setdefault(unit(a, mods), set()).add(unit(b, mods))
  index, low, stack, on, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      group = []
      while True:
        w = stack.pop()
        on.discard(w)
        group.append(w)
        if w == v:
          break
      if len(group) > 1:
        out.append(sorted(group))

  for v in list(graph):
    if v not in index:
      visit(v)
  return out


def test_every_unit_has_a_layer():
  mods = modules()
  missing = sorted({unit(m, mods) for m in mods} - set(RANK))
  assert not missing, f"folders or modules with no layer in LAYERS: {missing}"


def test_no_import_climbs_the_layers_beyond_the_listed_ones():
  got = {f"{a} -> {b}" for a, b in climbing_edges()}
  new, gone = sorted(got - CLIMBING), sorted(CLIMBING - got)
  assert not new, f"{len(new)} new imports climb the layers: {new}"
  assert not gone, f"listed imports no longer climb (drop them from CLIMBING): {gone}"


def test_no_cycle_between_folders_outside_the_listed_imports():
  listed = {tuple(e.split(" -> ")) for e in CLIMBING}
  assert folder_cycles(listed) == []


def test_config_imports_nothing_of_the_package_but_errors():
  """config/ is a leaf (issue 40, item 1): a Config is built and checked on its own;
  what needs the stages is checked at the edge (recipes/config_checks.py)."""
  mods, edges = modules(), import_edges()
  got = {f"{a} -> {b}" for a, bs in edges.items() if unit(a, mods) == "config/"
         for b in bs if unit(b, mods) not in ("config/", "errors.py")}
  assert not got, f"config/ imports the package: {sorted(got)}"


def test_the_check_sees_a_cycle():
  """Not vacuous: the package's graph with one climbing import added (core/ imported
  from privacy/, as the report code did until issue 40) has a cycle between folders."""
  edges = import_edges()
  assert folder_cycles(set(), edges) == []
  edges["fedjax_dp.privacy.setup"] = edges["fedjax_dp.privacy.setup"] | {
      "fedjax_dp.core.simulation"}
  assert ["core/", "privacy/"] in [sorted(set(g) & {"core/", "privacy/"}) for g in
                                   folder_cycles(set(), edges)]


CLIMBING: set[str] = set()   # empty since issue 40's report move; it may only stay so


# where the flat config may be read (issue 40, item 2): config/ itself, recipes/
# (from_config, plan_run: the edge's readers) and the layers above core/
EDGE = ("config/", "recipes/", "experiment/", "sweeps/", "callbacks.py", "api.py", "cli/",
        "__init__.py", "__main__.py")


def config_readers(mods: dict[str, str] | None = None) -> set[str]:
  """'module.function' of every function below the edge that takes the config: a
  parameter named cfg or config, or one annotated Config."""
  mods = mods or modules()
  found = set()
  for m, path in mods.items():
    if unit(m, mods) in EDGE:
      continue
    with open(path) as f:
      tree = ast.parse(f.read())
    for n in ast.walk(tree):
      if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        for a in n.args.args + n.args.kwonlyargs + n.args.posonlyargs:
          note = ast.unparse(a.annotation) if a.annotation is not None else ""
          if a.arg in ("cfg", "config") or re.search(r"\bConfig\b", note):
            found.add(f"{m}.{getattr(n, 'name', '<lambda>')}")
  return found


def test_nothing_below_the_edge_takes_the_config():
  """The config is read once at the edge (recipes.plan_run); build_simulation, the
  round and the stages take the plan's records and built stages."""
  assert config_readers() == set()


def test_the_config_check_sees_a_reader(tmp_path):
  """Not vacuous: a module of core/ with a function taking cfg is found."""
  path = tmp_path / "reader.py"
  path.write_text("def build(cfg):\n  return cfg.rounds\n\ndef fine(plan, x: int):\n  pass\n")
  assert config_readers({"fedjax_dp.core.reader": str(path)}) == {"fedjax_dp.core.reader.build"}


def _builds_during(run) -> int:
  """How many recipes recipes.flat builds while `run()` runs."""
  from fedjax_dp.recipes import flat
  built = []
  read = flat._read

  def counting(cfg):
    built.append(cfg)
    return read(cfg)
  flat._read = counting
  flat._LAST_BUILT.clear()
  try:
    run()
  finally:
    flat._read = read
  return len(built)


@pytest.mark.parametrize("how", ["cli", "api"])
def test_the_recipe_is_built_once_per_start(tmp_path, how):
  """Issue 40, item 2: the config's check and the run's plan share one recipe (the
  review counted 7 builds per start)."""
  import fedjax_dp
  from fedjax_dp.cli import main
  values = {"num_clients": 10, "clients_per_round": 5, "hidden": [8], "rounds": 1,
            "eval_every": 1, "algorithm": "fedprox", "dp": "central", "noise_multiplier": 1.0}
  if how == "cli":
    sets = [f"{k}={v}".replace(" ", "") for k, v in values.items()]
    run = lambda: main(["run", "--no-progress", "--out", str(tmp_path / "r"), "--set", *sets])
  else:
    rest = {k: v for k, v in values.items() if k != "algorithm"}
    run = lambda: fedjax_dp.run("fedprox", out=str(tmp_path / "r"), progress=False, **rest)
  assert _builds_during(run) == 1


def test_a_changed_registry_builds_the_recipe_afresh():
  """The shared recipe is keyed on the registries' entries: a rule registered again
  under its name gives a new recipe, not the old one."""
  from fedjax_dp import make_config, recipes, robust
  from tests.helpers import registries_restored
  cfg = make_config({"aggregator": "median"})
  first = recipes.from_config(cfg)
  assert recipes.from_config(cfg) is first
  with registries_restored():
    robust.AGGREGATORS["median"] = lambda: robust.AGGREGATORS["mean"]()
    assert recipes.from_config(cfg).rule.name == "mean"
  assert recipes.from_config(cfg).rule.name == first.rule.name


def oversized(files: dict[str, str], max_function: int = 80,
              max_module: int = 400) -> list[str]:
  """Functions over `max_function` lines and modules over `max_module` (issue 40,
  item 6: each fits on a screen, one concept per module)."""
  found = []
  for m, path in files.items():
    source = open(path).read()
    if source.count("\n") > max_module:
      found.append(f"{m}: {source.count(chr(10))} lines")
    for n in ast.walk(ast.parse(source)):
      if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if n.end_lineno - n.lineno + 1 > max_function:
          found.append(f"{m}.{n.name}: {n.end_lineno - n.lineno + 1} lines")
  return found


def test_no_function_over_80_lines_and_no_module_over_400():
  assert oversized(modules()) == []


def test_the_size_check_sees_a_long_function_and_a_long_module(tmp_path):
  """Not vacuous: an 81-line function and a 401-line module are found."""
  path = tmp_path / "big.py"
  path.write_text("def long():\n" + "  x = 1\n" * 80 + "\n" * 320)
  assert oversized({"big": str(path)}) == ["big: 401 lines", "big.long: 81 lines"]
