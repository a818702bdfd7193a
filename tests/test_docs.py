"""The documentation's structure: the README a landing page whose links resolve, every
page in the site's nav, the generated pages equal to their definitions, every public
name in the API reference, and the benchmark pages' commands naming real scripts and
options. (The pages' commands and code run in tests/test_readme_commands.py; the site
itself builds with warnings as errors in `make docs`, which CI runs.)"""

import glob
import os
import re
import shlex

import fedjax_dp
from fedjax_dp.cli import reference as cli_reference
from tests.doc_pages import MEASURED, ROOT, pages, text

README_MAX_LINES = 200   # the first-hour review: the peers' READMEs are 44-150 lines


def test_the_readme_is_a_landing_page():
  lines = text("README.md").splitlines()
  assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
  headings = [l for l in lines if l.startswith("## ")]
  for needed in ("## Install", "## Quick start 1", "## Quick start 2", "## Quick start 3",
                 "## Documentation"):
    assert any(h.startswith(needed) for h in headings), needed


def _links(page: str) -> list[str]:
  return [m for m in re.findall(r"\]\(([^)\s]+)\)", text(page))
          if not re.match(r"[a-z]+://|#|mailto:", m)]


def test_every_relative_link_resolves():
  """The README's links (GitHub resolves them from the root) and the pages' (from the
  page's folder; mkdocs checks the site's own, this checks them on GitHub too)."""
  for page in pages():
    folder = os.path.dirname(os.path.join(ROOT, page))
    for link in _links(page):
      target = os.path.normpath(os.path.join(folder, link.split("#")[0]))
      assert os.path.exists(target), f"{page}: link {link} -> {target} does not exist"


def test_every_docs_page_is_in_the_nav():
  listed = {os.path.realpath(os.path.join(ROOT, p)) for p in pages()}
  for path in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True):
    assert os.path.realpath(path) in listed, f"{path} is in docs/ but not in mkdocs.yml's nav"


def test_the_cli_page_is_the_generated_one():
  page = os.path.join(ROOT, "docs", "reference", "cli.md")
  with open(page) as f:
    current = f.read()
  assert cli_reference.with_table(current) == current, (
      "docs/reference/cli.md is stale: run `.venv/bin/python -m fedjax_dp.cli.reference "
      "docs/reference/cli.md`")


def test_the_cli_page_has_every_command():
  from fedjax_dp.cli.parser import build_parser
  names = [name for name, _ in cli_reference.commands(build_parser(), "fedjax-dp")]
  assert {"fedjax-dp run", "fedjax-dp sweep", "fedjax-dp account", "fedjax-dp attack mia",
          "fedjax-dp audit"} <= set(names)
  page = text("docs/reference/cli.md")
  for name in names:
    assert f"## `{name}`" in page, name


def test_every_public_name_is_in_the_api_reference():
  page = text("docs/reference/api.md")
  documented = re.findall(r"^::: (\S+)", page, re.M)
  for name in fedjax_dp.__all__:
    where = fedjax_dp._NAMES.get(name) or fedjax_dp._SUBMODULES[name]
    full = f"fedjax_dp.{where}"
    ok = (f"{full}.{name}" in documented or full in documented
          or (name in fedjax_dp._SUBMODULES and any(d.startswith(full) for d in documented)))
    assert ok or name in ("api", "config", "runner", "sweeps"), (
        f"fedjax_dp.{name} ({full}) is not in docs/reference/api.md")


def _benchmark_commands() -> list[tuple[str, str, list[str]]]:
  """(page, script, options) of every `python benchmarks/X.py ...` line of the
  benchmark pages (continuations joined)."""
  out = []
  for page in (p for p in pages() if p.startswith(MEASURED)):
    for body in re.findall(r"```bash\n(.*?)```", text(page), re.S):
      for line in body.replace("\\\n", " ").splitlines():
        code = line.split(" #")[0].strip()
        m = re.search(r"python\S* (benchmarks/\S+\.py)(.*)", code)
        if m:
          options = [w.split("=")[0] for w in shlex.split(m.group(2)) if w.startswith("--")]
          out.append((page, m.group(1), options))
  return out


def test_benchmark_commands_name_real_scripts_and_options():
  """The benchmark pages' commands run for minutes to hours (not in the suite): each
  names a script that exists and options that script defines."""
  commands = _benchmark_commands()
  assert len(commands) >= 10
  for page, script, options in commands:
    path = os.path.join(ROOT, script)
    assert os.path.exists(path), f"{page}: {script} does not exist"
    with open(path) as f:
      source = f.read()
    for option in options:
      assert f'"{option}"' in source, f"{page}: {script} has no option {option}"
