"""A run that diverges: metrics rows without bare NaN, the one-line report of where
the model stopped being finite, and the early warning of a loss that grew tenfold.

JSON has no NaN or Infinity: `json.dumps` writes them as bare tokens most parsers
refuse. A row's non-finite figure is written as null and its key is listed under
`nonfinite`, so that "not measured" (null alone) and "measured, not finite" differ.
"""

from __future__ import annotations

import math
from typing import Any

# exit status of `fedjax-dp run` for a run that diverged (its outputs up to there are kept)
DIVERGED = 3

LOSS_GROWTH = 10.0   # warn once when the loss reaches this multiple of its lowest value


def finite_row(row: dict[str, Any]) -> dict[str, Any]:
  """`row` with each non-finite number replaced by None and the keys replaced listed
  under 'nonfinite' (absent when there are none)."""
  bad = [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)]
  if not bad:
    return row
  return {**{k: (None if k in bad else v) for k, v in row.items()}, "nonfinite": bad}


def json_safe(obj: Any) -> Any:
  """obj with every non-finite float (nested in dicts, lists, tuples) as None: what
  summary.json and the other JSON files hold in place of NaN and Infinity."""
  if isinstance(obj, float):
    return obj if math.isfinite(obj) else None
  if isinstance(obj, dict):
    return {k: json_safe(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [json_safe(v) for v in obj]
  return obj


def row_is_finite(row: dict[str, Any]) -> bool:
  """Are the row's test metrics finite (None: not measured)? The train loss may be
  non-finite while the model is not: a client whose local training diverged sends
  nothing under DP and the robust rules (its upload is dropped)."""
  return not any(k.startswith("test_") for k in row.get("nonfinite", ()))


def last_finite(rows: list[dict]) -> dict | None:
  """The last row whose test metrics are all finite."""
  return next((r for r in reversed(rows) if row_is_finite(r)), None)


def _shown(row: dict, keys=("test_accuracy", "test_loss", "train_loss")) -> str:
  parts = [f"{k.replace('_', ' ')} {row[k]:.4g}" for k in keys if row.get(k) is not None]
  return f"round {row['round']}" + (": " + ", ".join(parts) if parts else "")


def report(round_: int, what: str, rows: list[dict]) -> dict:
  """summary.json's 'diverged': where and how the run stopped, and its last finite
  evaluation."""
  last = last_finite(rows)
  return {"round": round_, "what": what,
          "last_finite": ({k: last.get(k) for k in ("round", "test_accuracy", "test_loss",
                                                     "train_loss") if k in last}
                          if last else None)}


PLAIN_ADVICE = "try a lower lr, or clip the updates"


def advice(noise_ratio: float | None) -> str:
  """What to try for a diverging run: under DP (noise_ratio: the noise's std on the mean
  update over the clip norm, noise.mean_update_ratio) the noise comes first, since the
  updates are already clipped."""
  if noise_ratio is None:
    return PLAIN_ADVICE
  return (f"under DP the noise is the likely cause, std {noise_ratio:.3g} x clip_norm on the "
          "mean update each round: more clients per round, a larger target_epsilon or fewer "
          "rounds lower it; else a lower lr")


def message(diverged: dict, out: str, advised: str = PLAIN_ADVICE) -> str:
  """The one line `fedjax-dp run` prints for a diverged run (`advised`: advice())."""
  last = diverged["last_finite"]
  shown = _shown(last) if last else "none (the first evaluation was not finite)"
  return (f"the run diverged at round {diverged['round']}: {diverged['what']}; last finite "
          f"evaluation: {shown}; outputs up to round {diverged['round']} are in {out} "
          f"({advised})")


def loss_growth(rows: list[dict], initial: float | None = None,
                advised: str = PLAIN_ADVICE) -> str | None:
  """A warning when the newest row's loss (train, else test) is LOSS_GROWTH times the
  lowest before it: the rows before it, and `initial`, the untrained model's test
  loss (a loss that was absurd from the first evaluation), else None."""
  key = "train_loss" if rows and rows[-1].get("train_loss") is not None else "test_loss"
  now = rows[-1].get(key) if rows else None
  earlier = [(r[key], f"round {r['round']}") for r in rows[:-1] if r.get(key) is not None]
  if initial is not None and math.isfinite(initial):
    earlier.append((initial, "the untrained model's test loss"))
  if now is None or not earlier:
    return None
  low, at = min(earlier)
  if low > 0 and now >= LOSS_GROWTH * low:
    return (f"{key.replace('_', ' ')} {now:.4g} at round {rows[-1]['round']} is "
            f"{now / low:.3g}x its lowest ({low:.4g}, {at}): the run may be diverging "
            f"({advised})")
  return None
