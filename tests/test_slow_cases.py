"""tests/slow_cases.txt stays true: every listed case is a test that exists, so a
renamed test cannot slip back into `make test` (or out of CI) unnoticed."""

import os
import re

from tests.conftest import ROOT, SLOW_CASES


def test_every_listed_slow_case_names_an_existing_test():
  missing = []
  for nodeid in sorted(SLOW_CASES):
    path, _, name = nodeid.partition("::")
    function = name.split("[")[0]
    source = os.path.join(ROOT, path)
    if not os.path.exists(source) or not re.search(
        rf"^def {re.escape(function)}\(", open(source).read(), re.M):
      missing.append(nodeid)
  assert not missing, f"tests/slow_cases.txt lists tests that do not exist: {missing}"
  assert len(SLOW_CASES) > 10   # the list was read
