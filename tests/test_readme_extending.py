"""The README's Extending section runs as written: its python blocks are executed
in order (a term and an aggregator registered at run time, one short run)."""

import os
import re

from fedjax_dp.algorithms import registry as term_registry
from fedjax_dp.robust import registry as rule_registry

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def extending_blocks() -> list[str]:
  text = open(README).read()
  section = text.split("## Extending", 1)[1].split("\n## ", 1)[0]
  return re.findall(r"```python\n(.*?)```", section, re.S)


def test_readme_extending_snippets_run(capsys):
  blocks = extending_blocks()
  assert len(blocks) == 3
  namespace = {}
  registries = (term_registry.TERMS, term_registry.ALGORITHMS, rule_registry.AGGREGATORS)
  saved = [dict(r) for r in registries]
  try:
    for block in blocks:
      exec(compile(block, README, "exec"), namespace)
  finally:   # the registries, in place, as they were (other tests in this process read them)
    for registry, before in zip(registries, saved):
      registry.clear()
      registry.update(before)
  stats = namespace["stats"]
  assert stats.flagged.shape == (2,)
  assert int(namespace["state"].round) == 2
  assert "weight_decay" in namespace["cfg"].algorithm
