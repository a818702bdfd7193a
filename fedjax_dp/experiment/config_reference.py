"""The config keys' reference, generated from their rows (config/keys.py): each key's
default, allowed values (its choices, range, nullability, the registries of
algorithms and aggregation rules), what turns it on (config_checks.read_condition)
and its one-line meaning. `fedjax-dp config` prints it (with the keys of the
plugins a config lists: config/plugin_keys.py), and the docs' key table
(docs/reference/config.md) is this module's markdown of the built-in keys, checked equal
by a test so the two cannot drift (`python -m fedjax_dp.experiment.config_reference
docs/reference/config.md` rewrites the table).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from fedjax_dp.experiment.generated_block import rewrite_main, with_block
from fedjax_dp.config.key import Key
from fedjax_dp.config.keys import KEYS
from fedjax_dp.config.plugin_keys import PLUGIN_KEYS
from fedjax_dp.config.schema import _FIELDS, _OPTIONAL, CHOICES, PRESETS, RANGES, Config

# the sections the reference lists keys under, and each key's meaning and limits: the
# keys' rows (config/keys.py)
SECTIONS: dict[str, tuple[str, ...]] = {}
for _key in KEYS:
  SECTIONS[_key.section] = SECTIONS.get(_key.section, ()) + (_key.name,)
MEANINGS: dict[str, str] = {k.name: k.meaning for k in KEYS}
_LIMITS = {k.name: k.limit for k in KEYS if k.limit}     # limits that involve another key
_ALLOWED = {k.name: k.allowed for k in KEYS if k.allowed}   # stated by hand


@dataclasses.dataclass(frozen=True)
class KeyReference:
  """What `fedjax-dp config --show KEY` prints for one key."""
  key: str
  section: str
  default: str        # as written in YAML
  allowed: str
  meaning: str
  read_with: str | None   # the setting that makes the key read; None: always read
  presets: str | None     # defaults an algorithm brings, e.g. "topksdp: 0.9"

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def show_value(value: Any) -> str:
  """A default as it is written in YAML: null, true, [200, 200], 1e-05."""
  if value is None:
    return "null"
  if isinstance(value, bool):
    return str(value).lower()
  if isinstance(value, (tuple, list)):
    return "[" + ", ".join(show_value(v) for v in value) + "]"
  if isinstance(value, float):
    return f"{value:g}"
  return str(value) if value != "" else "''"


def _show_bound(v: float, is_int: bool) -> str:
  return str(int(v)) if is_int else f"{v:g}"


def allowed_values(key: str) -> str:
  """The key's allowed values, from its choices, range, type and optionality."""
  kind = _OPTIONAL.get(key, type(getattr(Config(), key)))
  if key in _ALLOWED:
    text = _ALLOWED[key]
  elif key == "aggregator":
    from fedjax_dp.robust import AGGREGATORS
    text = ", ".join(AGGREGATORS)
  elif key == "dataset":
    from fedjax_dp.data import DATASETS
    text = ", ".join(DATASETS) + ", custom; or a registered dataset's name"
  elif key == "dp":
    from fedjax_dp.privacy.mechanisms import MECHANISMS
    text = ", ".join(MECHANISMS) + "; or a registered mechanism's name"
  elif key == "kept_noise":
    from fedjax_dp.privacy.mechanisms import KEPT_NOISE
    text = ", ".join(("none", *KEPT_NOISE)) + "; or a registered calibration's name"
  elif key == "algorithm":
    from fedjax_dp.algorithms.registry import ALGORITHMS
    text = ", ".join(ALGORITHMS) + "; or local terms joined by +"
  elif key in CHOICES:
    text = ", ".join(CHOICES[key])
  elif key in RANGES:
    text = _range_text(key, kind is int)
  elif key == "hidden":
    text = "a list of integers >= 1"
  elif key == "tier_noise_multipliers":
    text = "5 numbers > 0"
  elif key == "plugins":
    text = "a list of .py files or module names"
  elif kind is bool:
    text = "true, false"
  elif key.endswith(("_path", "_dir")):
    text = "a path"
  elif kind is str:
    text = "a string"
  else:
    text = {int: "an integer", float: "a number"}[kind]
  if key in _LIMITS:
    text += f"; {_LIMITS[key]}"
  if key in _OPTIONAL and "path" not in text:
    text += "; or null"
  elif key in _OPTIONAL:
    text += " or null"
  return text


def _range_text(key: str, is_int: bool) -> str:
  return _bounds_text(RANGES[key], is_int)


def _bounds_text(bounds, is_int: bool) -> str:
  lo, hi, lo_inc, hi_inc = bounds
  if lo is not None and hi is not None:
    if is_int:   # whole numbers: both ends inclusive
      return f"{int(lo) if lo_inc else int(lo) + 1}..{int(hi) if hi_inc else int(hi) - 1}"
    return (f"{'[' if lo_inc else '('}{_show_bound(lo, False)}, "
            f"{_show_bound(hi, False)}{']' if hi_inc else ')'}")
  if lo is not None:
    return f"{'>=' if lo_inc else '>'} {_show_bound(lo, is_int)}"
  return f"{'<=' if hi_inc else '<'} {_show_bound(hi, is_int)}"


def section_of(key: str) -> str:
  for title, keys in SECTIONS.items():
    if key in keys:
      return title
  raise KeyError(key)


def reference(key: str) -> KeyReference:
  """The reference of one config key, built-in or a registered plugin's (KeyError for
  an unknown key)."""
  from fedjax_dp.recipes.config_checks import read_condition
  if key in PLUGIN_KEYS:
    row = PLUGIN_KEYS[key]
    return KeyReference(key=key, section=row.section, default=show_value(row.default),
                        allowed=_plugin_allowed(row), meaning=row.meaning,
                        read_with=read_condition(key), presets=None)
  if key not in _FIELDS:
    raise KeyError(key)
  presets = [f"{name}: {show_value(p[key])}" for name, p in PRESETS.items() if key in p]
  return KeyReference(key=key, section=section_of(key), default=show_value(getattr(Config(), key)),
                      allowed=allowed_values(key), meaning=MEANINGS[key],
                      read_with=read_condition(key), presets="; ".join(presets) or None)


def _plugin_allowed(row: Key) -> str:
  """A plugin key's allowed values, from its row (stated by hand, or its choices,
  range, type; with a limit that involves another key)."""
  kind = type(row.default)
  if row.allowed:
    text = row.allowed
  elif row.choices:
    text = ", ".join(show_value(c) for c in row.choices)
  elif row.bounds is not None and kind in (int, float):
    text = _bounds_text(row.bounds, kind is int)
  else:
    text = {bool: "true, false", str: "a string", int: "an integer", float: "a number"}[kind]
  return f"{text}; {row.limit}" if row.limit else text


def sections() -> dict[str, tuple[str, ...]]:
  """SECTIONS, then the registered plugins' keys by their sections."""
  out = dict(SECTIONS)
  for row in PLUGIN_KEYS.values():
    out[row.section] = out.get(row.section, ()) + (row.name,)
  return out


def all_references() -> list[KeyReference]:
  """Every key, by section (the registered plugins' keys last)."""
  return [reference(k) for keys in sections().values() for k in keys]


def listing() -> str:
  """`fedjax-dp config`: one line per key (key, default, allowed -- meaning), by
  section, so that `fedjax-dp config | grep noise` finds a key."""
  refs = all_references()
  shown = {r.key: r.default + (f" ({r.presets})" if r.presets else "") for r in refs}
  width = max(len(r.key) for r in refs) + 2
  dwidth = max(len(d) for d in shown.values()) + 2
  lines = []
  for title, keys in sections().items():
    lines.append(f"# {title}")
    for r in (reference(k) for k in keys):
      lines.append(f"{r.key:<{width}}{shown[r.key]:<{dwidth}}{r.allowed}  -- {r.meaning}")
    lines.append("")
  return "\n".join(lines).rstrip() + "\n"


def detail(key: str) -> str:
  """`fedjax-dp config --show KEY`: one key in full."""
  r = reference(key)
  rows = [("section", r.section), ("default", r.default)]
  if r.presets:
    rows.append(("presets", r.presets))
  rows += [("allowed", r.allowed), ("read", f"with {r.read_with}" if r.read_with else "always"),
           ("meaning", r.meaning)]
  return key + "\n" + "".join(f"  {name + ':':<9} {text}\n" for name, text in rows)


def _cell(text: str) -> str:
  return text.replace("|", "\\|")


def markdown() -> str:
  """The docs' key table: one table per section, one row per key."""
  out = []
  for title, keys in SECTIONS.items():
    out += [f"**{title[0].upper() + title[1:]}**", "",
            "| key | default | allowed | read only with | meaning |",
            "| --- | --- | --- | --- | --- |"]
    for r in (reference(k) for k in keys):
      default = f"`{r.default}`" + (f" ({r.presets})" if r.presets else "")
      cells = (f"`{r.key}`", default, r.allowed, r.read_with or "", r.meaning)
      out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    out.append("")
  return "\n".join(out)


BEGIN = ("<!-- config keys: generated by `python -m fedjax_dp.experiment.config_reference "
         "docs/reference/config.md` -->")
END = "<!-- end of generated config keys -->"


def page_with_table(text: str) -> str:
  """`text` (the page) with the generated table between BEGIN and END."""
  return with_block(text, BEGIN, END, markdown())


def main(argv: list[str]) -> int:
  """Rewrites the page's generated key table in place."""
  return rewrite_main(argv, "python -m fedjax_dp.experiment.config_reference "
                      "docs/reference/config.md", BEGIN, END, markdown, "config key table")


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
