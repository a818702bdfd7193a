"""Records tests/golden (test_golden.py's docstring says what each file checks).

  # the numbers changed on purpose: every case's report digest and values, and
  # this machine's bits, anew (other machines' bits are kept for the cases whose
  # bits here did not change, dropped for the rest: stale)
  .venv/bin/python tests/golden/regenerate.py record
  # this machine's bits beside the recorded ones, once its values and reports
  # agree with the recorded ones (so adding a machine changes no number)
  .venv/bin/python tests/golden/regenerate.py add-machine
  # the same from another machine (a lent device machine, say): its results in
  # OUT.npz and OUT.json there, added here
  python3 tests/golden/regenerate.py values OUT          # there
  .venv/bin/python tests/golden/regenerate.py add-machine OUT   # here
  # the privacy report's form changed on purpose, its numbers did not: the report
  # digests anew, only where every case's state and stats are this machine's recorded
  # bits and its values the recorded ones (so no number of a round can change)
  .venv/bin/python tests/golden/regenerate.py reports
  # another CPU's rounding: two values files' largest deviation per case (relative
  # to each leaf's largest entry; integers equal or not)
  .venv/bin/python tests/golden/regenerate.py compare A.npz B.npz
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _environment() -> None:
  """test_golden's environment (conftest.py's flags) before JAX starts."""
  sys.path.insert(0, ROOT)
  os.environ.pop("FEDJAX_DP_CPU_DEVICES", None)
  os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                        "--xla_backend_optimization_level=0")
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "float32")


def _run_all():
  """{(name, devices): (digests, values)} of every case, run here."""
  from tests import test_golden as g
  out = {}
  for name in sorted(g.CONFIGS):
    for devices in (1, 2):
      out[name, devices] = g.run_golden(name, devices)
      print(f"{name} on {devices} devices", flush=True)
  return out


def _write_atomic(path: str, write) -> None:
  tmp = f"{path}.{os.getpid()}.tmp"
  write(tmp)
  os.replace(tmp, path)


def _bits(results: dict, machine: str) -> dict:
  """{machine key: {machine, cases: {name: {devices: state and stats digests}}}}."""
  from tests import test_golden as g
  cases = {}
  for (name, devices), (digests, _) in results.items():
    cases.setdefault(name, {})[str(devices)] = {k: digests[k] for k in ("state", "stats")}
  return {g.machine_key(machine): {"machine": machine, "cases": cases}}


def _save_json(golden: dict) -> None:
  from tests import test_golden as g
  def write(tmp):
    with open(tmp, "w") as f:
      json.dump(golden, f, indent=1, sort_keys=True)
  _write_atomic(g.GOLDEN, write)


def _save_values(path: str, results: dict) -> None:
  import numpy as np
  arrays = {f"{name}-{devices}/{k}": v for (name, devices), (_, values) in results.items()
            for k, v in values.items()}
  def write(tmp):
    with open(tmp, "wb") as f:
      np.savez_compressed(f, **arrays)
  _write_atomic(path, write)


def record() -> None:
  from tests import test_golden as g
  results = _run_all()
  report = {}
  for (name, devices), (digests, _) in results.items():
    report.setdefault(name, {})[str(devices)] = digests["report"]
  _save_values(g.VALUES, results)
  mine = _bits(results, g.golden_machine())
  _save_json({"report": report, "machines": {**_unchanged_elsewhere(mine), **mine}})
  print(f"{g.GOLDEN}, {g.VALUES}: {len(results)} cases recorded on {g.golden_machine()}")


def _unchanged_elsewhere(mine: dict) -> dict:
  """The other machines' recorded bits of the cases whose bits on this machine did
  not change (their numbers did not: those machines' bits still hold); the rest of
  theirs are dropped, stale."""
  from tests import test_golden as g
  if not os.path.exists(g.GOLDEN):
    return {}
  with open(g.GOLDEN) as f:
    old = json.load(f).get("machines", {})
  (key, new), = mine.items()
  before = old.get(key, {}).get("cases", {})
  same = {c for c, v in new["cases"].items() if before.get(c) == v}
  return {k: dict(m, cases={c: v for c, v in m["cases"].items() if c in same})
          for k, m in old.items() if k != key and key in old}


def _load(out: str) -> dict:
  """values(out)'s results: {(name, devices): (digests, values)}."""
  import numpy as np
  with open(out + ".json") as f:
    saved = json.load(f)
  results = {}
  with np.load(out + ".npz") as z:
    for k in z.files:
      case, leaf = k.split("/")
      name, devices = case.rsplit("-", 1)
      results.setdefault((name, int(devices)), ({}, {}))[1][leaf] = z[k]
  for (name, devices), (digests, _) in results.items():
    digests.update(saved["cases"][name][str(devices)])
  return results, saved["machine"]


def add_machine(out: str | None = None) -> None:
  from tests import test_golden as g
  golden, bad = g._golden(), []
  results, machine = _load(out) if out else (_run_all(), g.golden_machine())
  for (name, devices), (digests, values) in results.items():
    if digests["report"] != golden["report"][name][str(devices)]:
      bad.append(f"{name}-{devices}: report")
    bad += [f"{name}-{devices}: {m}" for m in
            g.value_mismatches(values, g.recorded_values(name, devices))]
  if bad:
    sys.exit("not added, this machine's results differ from the recorded ones:\n  "
             + "\n  ".join(bad))
  golden["machines"].update(_bits(results, machine))
  _save_json(golden)
  print(f"{g.GOLDEN}: added {machine}")


def reports() -> None:
  from tests import test_golden as g
  golden, bad = g._golden(), []
  bits = golden["machines"].get(g.machine_key(g.golden_machine()))
  if bits is None:
    sys.exit(f"no bits recorded for {g.golden_machine()}: the reports are re-recorded only "
             "where this machine's rounds can be checked bit for bit")
  results = _run_all()
  for (name, devices), (digests, values) in results.items():
    want = bits["cases"][name][str(devices)]
    bad += [f"{name}-{devices}: {k}" for k in want if want[k] != digests[k]]
    bad += [f"{name}-{devices}: {m}" for m in
            g.value_mismatches(values, g.recorded_values(name, devices))]
  if bad:
    sys.exit("reports not re-recorded, the rounds' results changed:\n  " + "\n  ".join(bad))
  changed = 0
  for (name, devices), (digests, _) in results.items():
    changed += golden["report"][name][str(devices)] != digests["report"]
    golden["report"][name][str(devices)] = digests["report"]
  _save_json(golden)
  print(f"{g.GOLDEN}: {changed} of {len(results)} report digests re-recorded; every round's "
        "state and stats bit for bit as recorded")


def values(out: str) -> None:
  """This machine's results: OUT.npz (values) and OUT.json (digests, machine)."""
  from tests import test_golden as g
  results = _run_all()
  _save_values(out + ".npz", results)
  cases = {}
  for (name, devices), (digests, _) in results.items():
    cases.setdefault(name, {})[str(devices)] = digests
  def write(tmp):
    with open(tmp, "w") as f:
      json.dump({"machine": g.golden_machine(), "cases": cases}, f, indent=1, sort_keys=True)
  _write_atomic(out + ".json", write)


def compare(a: str, b: str) -> None:
  """Per case: the largest deviation of any float array relative to its largest
  entry, and whether any integer array differs."""
  import numpy as np
  with np.load(a) as za, np.load(b) as zb:
    worst = {}
    for k in sorted(set(za.files) & set(zb.files)):
      case = k.split("/")[0]
      x, y = za[k], zb[k]
      if not np.issubdtype(x.dtype, np.floating):
        dev = 0.0 if np.array_equal(x, y) else float("inf")
      else:
        fin = np.isfinite(x) & np.isfinite(y)
        scale = float(np.max(np.abs(x[fin]), initial=0.0))
        err = float(np.max(np.abs(x[fin].astype(np.float64) - y[fin]), initial=0.0))
        dev = err / scale if scale else (0.0 if err == 0 else float("inf"))
      worst[case] = max(worst.get(case, 0.0), dev)
  for case, dev in sorted(worst.items(), key=lambda kv: -kv[1]):
    print(f"{dev:10.3g}  {case}")


if __name__ == "__main__":
  commands = {"record": (record, (0,)), "reports": (reports, (0,)),
              "add-machine": (add_machine, (0, 1)),
              "values": (values, (1,)), "compare": (compare, (2,))}
  if len(sys.argv) < 2 or sys.argv[1] not in commands or \
     len(sys.argv) - 2 not in commands[sys.argv[1]][1]:
    sys.exit("usage: regenerate.py record | reports | add-machine [OUT] | values OUT | "
             "compare A.npz B.npz")
  _environment()
  fn, _ = commands[sys.argv[1]]
  fn(*sys.argv[2:])
