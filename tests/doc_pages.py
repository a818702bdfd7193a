"""The documentation's pages in reading order, for the tests that run them: README.md,
then the site's pages in mkdocs.yml's nav order (docs/papers/*.md are links to
experiments/<paper>/README.md and docs/changelog.md to CHANGELOG.md: each file once)."""

from __future__ import annotations

import functools
import os
import re

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _nav_files(entry) -> list[str]:
  if isinstance(entry, str):
    return [entry]
  if isinstance(entry, dict):
    return [f for value in entry.values() for f in _nav_files(value)]
  return [f for item in entry for f in _nav_files(item)]


@functools.cache
def pages() -> tuple[str, ...]:
  """Every page's path from the project's root, README.md first, then the nav's order."""
  with open(os.path.join(ROOT, "mkdocs.yml")) as f:
    nav = yaml.safe_load(f)["nav"]
  out, seen = ["README.md"], {os.path.realpath(os.path.join(ROOT, "README.md"))}
  for name in _nav_files(nav):
    real = os.path.realpath(os.path.join(ROOT, "docs", name))
    if real not in seen:
      seen.add(real)
      out.append(os.path.relpath(real, ROOT))
  return tuple(out)


def text(page: str) -> str:
  with open(os.path.join(ROOT, page)) as f:
    return f.read()


# Pages whose commands the suite does not run as written, and why: what checks them
MEASURED = "docs/benchmarks/"   # benchmark runs of minutes to hours on a quiet machine;
                                # tests/test_docs.py checks each names a real script and options


def runnable_pages() -> tuple[str, ...]:
  return tuple(p for p in pages() if not p.startswith(MEASURED))


def blocks(kind: str, page: str | None = None) -> list[tuple[str, str]]:
  """("page:line", body) of every ```kind fenced block ('' for a bare fence) of one page
  or of every runnable page in order, the body dedented by its fence's indentation
  (blocks inside list items)."""
  out = []
  for name in ([page] if page else runnable_pages()):
    lang, body, start, indent = None, [], 0, 0
    for i, line in enumerate(text(name).splitlines(), 1):
      stripped = line.strip()
      if lang is None and stripped.startswith("```"):
        lang, body, start, indent = stripped[3:].strip(), [], i, len(line) - len(line.lstrip())
      elif lang is not None and stripped == "```":
        if lang == kind:
          out.append((f"{name}:{start}", "".join(l[indent:] + "\n" for l in body)))
        lang = None
      elif lang is not None:
        body.append(line)
  return out


def all_text() -> str:
  """Every page, in order (what a grep of the whole documentation reads)."""
  return "\n".join(text(p) for p in pages())


def code_spans(page: str) -> list[str]:
  return re.findall(r"`([^`\n]+)`", text(page))
