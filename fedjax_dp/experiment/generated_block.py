"""A docs page's generated block: the text between two HTML-comment markers, written
from a definition (the config keys' table, the commands' help) so that the page cannot
drift from what it documents; tests compare each page with its rewrite."""

from __future__ import annotations

import sys
from typing import Callable


def with_block(text: str, begin: str, end: str, body: str) -> str:
  """`text` (the page) with `body` between the markers `begin` and `end`."""
  head, found, rest = text.partition(begin)
  _, found_end, tail = rest.partition(end)
  if not (found and found_end):
    raise ValueError(f"the page has no {begin!r} ... {end!r} block")
  return f"{head}{begin}\n\n{body}\n{end}{tail}"


def rewrite_main(argv: list[str], usage: str, begin: str, end: str,
                 body: Callable[[], str], what: str) -> int:
  """`python -m MODULE PAGE`: rewrites PAGE's block in place (exit 2 with `usage`
  for another command line), and says whether it changed."""
  if len(argv) != 1:
    print(f"usage: {usage}", file=sys.stderr)
    return 2
  with open(argv[0]) as f:
    text = f.read()
  new = with_block(text, begin, end, body())
  if new != text:
    with open(argv[0], "w") as f:
      f.write(new)
  print(f"{argv[0]}: {what} {'updated' if new != text else 'already current'}")
  return 0
