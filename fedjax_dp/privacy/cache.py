"""Where fedjax-dp keeps what it computes once and reuses across runs (the analyzer's
trained network, optimised correlated-noise strategies): $FEDJAX_DP_CACHE/<kind>,
else $XDG_CACHE_HOME/fedjax-dp/<kind>, else ~/.cache/fedjax-dp/<kind>;
FEDJAX_DP_CACHE=off keeps nothing (computed in every process)."""

from __future__ import annotations

import os


def folder(kind: str) -> str | None:
  """The folder for `kind`, or None where FEDJAX_DP_CACHE=off."""
  root = os.environ.get("FEDJAX_DP_CACHE")
  if root is not None and root.strip().lower() == "off":
    return None
  if not root:
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    root = os.path.join(xdg, "fedjax-dp")
  return os.path.join(root, kind)
