"""Scaling: seconds per round, clients per second and peak memory from 1e2 to 1e6 clients.

Each point is its own process (so its peak resident memory is its own):
synthetic Gaussian-class data (32 features, 10 classes), 2 examples a client
(iid), MLP 32-64-10 (2,762 parameters), E = 1, batch 64, a fixed-size cohort
of min(clients, --cohort-max) drawn each round. Two kinds of run:

  stateless   FedAvg (the executor takes the one-step path: every client's
              local work is one step)
  stateful    SCAFFOLD: a [clients, d] control-variate table, read and written for
              the cohort each round: on the devices (--store device: sharded over
              them in blocks of client ids, replicated before b8cd2c2),
              or in a host table paged onto the device round by round (--store
              host: host memory; disk: files read and written by row; --store-dtype
              bfloat16 halves it). Each point reports the table's size.

A stateful point whose device table would need more than --max-table-gb is
skipped with the figure (--store device only).

Peers (--peers; default: each whose venv exists) run the same protocol in the same
invocation, right after our point at each size, on the same arrays (written to a
temporary .npz; benchmarks/peers/scaling_peer.py says what each does): FedJAX 0.0.17,
pfl-research 0.6.0 (PyTorch) and Flower 1.41 (Ray) at the stateless points, and the
one of them that ships SCAFFOLD, pfl-research, at the stateful points too (its
control variates in its in-memory user-state storage). A peer without its venv
is skipped with the command that builds it (benchmarks/peers/setup_*.sh). A peer
point whose round, predicted from that peer's previous point's clients per second,
would take more than --peer-timeout / (--peer-rounds + 1) is skipped with the
prediction, as is a peer that failed or ran out of time at a smaller size.

  python benchmarks/scaling.py [--clients 100 ... 1000000] [--store disk] [--json OUT]
      [--plot OUT.png] [--peers fedjax pfl flower] [--peer-rounds 2] [--peer-timeout 600]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
PEERS_DIR = os.path.join(HERE, "peers")
# name: (venv folder, script, the command that builds the venv)
PEERS = {"fedjax": (".venv-fedjax", "fedjax_scaling.py", "sh benchmarks/peers/setup_fedjax.sh"),
         "pfl": (".venv-pfl", "pfl_scaling.py", "sh benchmarks/peers/setup_pfl.sh"),
         "flower": (".venv-flower", "flower_scaling.py", "sh benchmarks/peers/setup_flower.sh")}
# the kinds of point each peer can run (the stateful one is SCAFFOLD: only pfl ships it)
PEER_KINDS = {"fedjax": ("stateless",), "pfl": ("stateless", "stateful"),
              "flower": ("stateless",)}
PEER_ALGORITHM = {"stateless": "fedavg", "stateful": "scaffold"}

FEATURES, CLASSES, HIDDEN, PER_CLIENT = 32, 10, 64, 2
PARAMS = FEATURES * HIDDEN + HIDDEN + HIDDEN * CLASSES + CLASSES


def point_config(clients: int, cohort: int, kind: str, store: str = "device",
                 dtype: str = "float32"):
  from fedjax_dp import make_config
  return make_config(dict(
      dataset="synthetic", synthetic_examples=PER_CLIENT * clients,
      synthetic_features=FEATURES, synthetic_classes=CLASSES, partition="iid",
      num_clients=clients, clients_per_round=cohort, sampling="fixed", model="mlp",
      hidden=[HIDDEN], local_epochs=1, batch_size=64, lr=0.05, momentum=0.0,
      algorithm="fedavg" if kind == "stateless" else "scaffold", seed=0,
      **({"client_state_store": store, "client_state_dtype": dtype}
         if kind == "stateful" and store != "device" else {})))


def one_point(clients: int, cohort: int, kind: str, rounds: int, store: str = "device",
              dtype: str = "float32") -> dict:
  """Runs in the child process: times `rounds` rounds after compilation."""
  from fedavg_round import time_rounds   # sets up one XLA CPU device per core first
  from fedjax_dp.experiment.setup import setup
  cfg = point_config(clients, cohort, kind, store, dtype)
  t = time.perf_counter()
  _, _, sim = setup(cfg)
  setup_s = time.perf_counter() - t
  _, compile_s, times = time_rounds(sim, rounds)
  med = statistics.median(times)
  table = (clients * PARAMS * (2 if dtype == "bfloat16" else 4) if kind == "stateful" else 0)
  return {"clients": clients, "cohort": cohort, "kind": kind,
          **({"store": store, "store_dtype": dtype, "table_gb": round(table / 2**30, 2)}
             if kind == "stateful" else {}),
          "client_parallelism": sim.client_parallelism, "setup_s": round(setup_s, 2),
          "compile_s": round(compile_s, 2), "round_s": [round(x, 4) for x in times],
          "median_round_s": round(med, 4), "clients_per_s": round(cohort / med),
          "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def run_point(clients: int, cohort: int, kind: str, rounds: int, max_table_gb: float,
              timeout_s: int, store: str = "device", dtype: str = "float32") -> dict:
  # sharded over the devices inside the rounds, but replicated on each in client order
  # (the start, checkpoints): the peak is still a copy per device
  table_gb = clients * PARAMS * 4 / 2**30 * max(os.cpu_count() or 1, 1)
  if kind == "stateful" and store == "device" and table_gb > max_table_gb:
    return {"clients": clients, "cohort": cohort, "kind": kind,
            "skipped": f"the [clients, d] table on every device would need {table_gb:.1f} GB "
                       f"(> --max-table-gb {max_table_gb})"}
  try:
    out = subprocess.run([sys.executable, __file__, "--one", str(clients), str(cohort), kind,
                          "--rounds", str(rounds), "--store", store, "--store-dtype", dtype],
                         capture_output=True, text=True,
                         timeout=timeout_s)
  except subprocess.TimeoutExpired:
    return {"clients": clients, "cohort": cohort, "kind": kind,
            "failed": f"did not finish within --timeout {timeout_s} s"}
  if out.returncode != 0:
    return {"clients": clients, "cohort": cohort, "kind": kind,
            "failed": f"exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]}"}
  return json.loads(out.stdout.strip().splitlines()[-1])


def write_peer_data(clients: int, cohort: int, path: str) -> None:
  """The arrays our points of this size train on (the stateless and the stateful share
  them), in client order (scaling_peer.py's format): the config's data, partition and
  feature scaling, as setup() builds them."""
  import numpy as np
  from fedjax_dp.data import apply_feature_scaling
  from fedjax_dp.experiment.setup import client_partition, load_data
  from fedjax_dp.experiment.reports.privacy_report import resolved_feature_scaling
  cfg = point_config(clients, cohort, "stateless")
  raw = load_data(cfg)
  parts = client_partition(cfg, raw)
  ds = apply_feature_scaling(raw, parts, resolved_feature_scaling(cfg))
  starts = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
  order = np.concatenate(parts)
  np.savez(path, x=ds.x_train[order], y=ds.y_train[order], starts=starts)


def peer_python(name: str) -> str:
  return os.path.join(PEERS_DIR, PEERS[name][0], "bin", "python")


def run_peer(name: str, clients: int, cohort: int, data: str, rounds: int,
             timeout_s: int, kind: str = "stateless") -> dict:
  head = {"library": name, "clients": clients, "cohort": cohort, "kind": kind}
  try:
    out = subprocess.run([peer_python(name), os.path.join(PEERS_DIR, PEERS[name][1]),
                          "--data", data, "--cohort", str(cohort), "--rounds", str(rounds),
                          "--algorithm", PEER_ALGORITHM[kind]],
                         capture_output=True, text=True, timeout=timeout_s)
  except subprocess.TimeoutExpired:
    return {**head, "failed": f"did not finish within --peer-timeout {timeout_s} s"}
  lines = [l for l in out.stdout.strip().splitlines() if l.startswith("{")]
  if out.returncode != 0 or not lines:
    return {**head, "failed": f"exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]}"}
  return {**head, **json.loads(lines[-1]), "library": name}


def peer_skip(previous: dict | None, cohort: int, rounds: int, timeout_s: int) -> str | None:
  """Why this peer's next point is not run, or None (see the module's docstring)."""
  if previous is None:
    return None
  if "median_round_s" not in previous:
    return f"not run: failed or skipped at {previous['clients']} clients"
  predicted = cohort / previous["clients_per_s"]
  if predicted * (rounds + 1) > timeout_s:
    return (f"not run: {previous['clients_per_s']} clients/s at {previous['clients']} clients "
            f"predicts {predicted:.0f} s a round, {rounds + 1} rounds over --peer-timeout "
            f"{timeout_s} s")
  return None


def plot(points: list[dict], path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
  for library, kind in sorted({(p.get("library", "fedjax-dp"), p["kind"]) for p in points}):
    done = [p for p in points if p.get("library", "fedjax-dp") == library and p["kind"] == kind
            and "median_round_s" in p]
    if not done:
      continue
    xs = [p["clients"] for p in done]
    label = f"{library} {kind}" if done[0].get("store", "device") == "device" else \
        f"{library} {kind} ({done[0]['store']} table, {done[0]['store_dtype']})"
    a.loglog(xs, [p["median_round_s"] for p in done], "o-", label=label)
    b.loglog(xs, [p["peak_rss_mb"] for p in done], "o-", label=label)
  a.set(xlabel="clients (cohort = min(clients, 1e4))", ylabel="seconds per round")
  b.set(xlabel="clients", ylabel="peak resident memory (MB)")
  for ax in (a, b):
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)


def main(argv=None):
  from cli_args import new_file, write_results, positive_float, positive_int
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--clients", type=positive_int, nargs="+",
                  default=[100, 1000, 10000, 100000, 1000000])
  ap.add_argument("--cohort-max", type=positive_int, default=10000)
  ap.add_argument("--kind", nargs="+", default=["stateless", "stateful"],
                  choices=["stateless", "stateful"])
  ap.add_argument("--rounds", type=positive_int, default=5)
  ap.add_argument("--max-table-gb", type=positive_float, default=8.0)
  ap.add_argument("--store", default="device", choices=["device", "host", "disk"],
                  help="where the stateful points keep their per-client table")
  ap.add_argument("--store-dtype", default="float32", choices=["float32", "bfloat16"])
  ap.add_argument("--timeout", type=positive_int, default=900, help="seconds per point")
  ap.add_argument("--peers", nargs="*", default=None, choices=sorted(PEERS),
                  help="peers to time beside our points (default: each whose venv "
                       "exists; none: --peers with no name)")
  ap.add_argument("--peer-rounds", type=positive_int, default=2,
                  help="timed rounds per peer point, after one warm-up round")
  ap.add_argument("--peer-timeout", type=positive_int, default=600,
                  help="seconds per peer point")
  ap.add_argument("--one", nargs=3, metavar=("CLIENTS", "COHORT", "KIND"), help=argparse.SUPPRESS)
  ap.add_argument("--peer-data", nargs=3, metavar=("CLIENTS", "COHORT", "PATH"),
                  help=argparse.SUPPRESS)
  ap.add_argument("--json", default=None, type=new_file,
                  help="write the results here too (refuses an existing file)")
  ap.add_argument("--plot", default=None, type=new_file,
                  help="log-log plot here (refuses an existing file)")
  args = ap.parse_args(argv)
  if args.peer_data:
    write_peer_data(int(args.peer_data[0]), int(args.peer_data[1]), args.peer_data[2])
    return
  if args.one:
    print(json.dumps(one_point(int(args.one[0]), int(args.one[1]), args.one[2], args.rounds,
                               args.store, args.store_dtype)))
    return
  peers = ([name for name in PEERS if os.path.exists(peer_python(name))]
           if args.peers is None else args.peers)
  for name in args.peers or []:
    if not set(PEER_KINDS[name]) & set(args.kind):
      ap.error(f"--peers {name}: it runs the {' and '.join(PEER_KINDS[name])} points only, "
               f"and --kind asks for {' '.join(args.kind)}")
  points, last = [], {}
  for name in sorted(set(PEERS) - set(peers)) if args.peers is None else []:
    points.append({"library": name, "kind": " ".join(PEER_KINDS[name]),
                   "skipped": f"no venv: build it with {PEERS[name][2]}"})
  for name in peers:
    if not os.path.exists(peer_python(name)):
      ap.error(f"--peers {name}: {peer_python(name)} is missing; build it with {PEERS[name][2]}")
  for kind in args.kind:
    for n in args.clients:
      cohort = min(n, args.cohort_max)
      points.append({"library": "fedjax-dp"} | run_point(
          n, cohort, kind, args.rounds, args.max_table_gb, args.timeout, args.store,
          args.store_dtype))
      print(json.dumps(points[-1]), file=sys.stderr, flush=True)
      skips = {name: peer_skip(last.get((name, kind)), cohort, args.peer_rounds,
                               args.peer_timeout)
               for name in peers if kind in PEER_KINDS[name]}
      for name, why in skips.items():
        if why:   # the next point is predicted from the last one measured
          points.append({"library": name, "clients": n, "cohort": cohort, "kind": kind,
                         "skipped": why})
          print(json.dumps(points[-1]), file=sys.stderr, flush=True)
      to_run = [name for name, why in skips.items() if not why]
      if not to_run:
        continue
      with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.npz")
        # in a child: a child's peak RSS starts at its parent's RSS when it was forked
        # (Linux keeps the high-water mark across fork and exec), so this process stays small
        subprocess.run([sys.executable, __file__, "--peer-data", str(n), str(cohort), data],
                       check=True)
        for name in to_run:
          points.append(run_peer(name, n, cohort, data, args.peer_rounds, args.peer_timeout,
                                 kind))
          last[name, kind] = points[-1]
          print(json.dumps(points[-1]), file=sys.stderr, flush=True)
  result = {"machine": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "params": PARAMS, "examples_per_client": PER_CLIENT, "points": points}
  print(json.dumps(result, indent=2))
  if args.json:
    write_results(result, args.json)
  if args.plot:
    plot(points, args.plot)


if __name__ == "__main__":
  main()
