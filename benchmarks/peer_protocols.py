"""The peers' own protocols side by side (issue 44): pfl-research's CIFAR-10 benchmark
and a FEMNIST-shaped protocol, fedjax-dp against pfl-research and FedJAX in one
invocation, on the same partition and the same initial weights.

Protocols (benchmarks/peers/protocol_peer.py has the details every framework reads):
pfl-research's image-classification settings (its configs/baseline.yaml and
femnist.yaml): cohort 50, local batch 10, one local epoch, client SGD lr 0.1 without
momentum, central SGD lr 1.0, no DP (1,500 rounds in its paper; here one warm-up
round, then the median of --rounds timed rounds).

  cifar10   pfl's cifar10_iid: 50,000 images 32x32x3 cut into 1,000 users of 50 after a
            shuffle, pfl's simple_cnn (model 'simple_cnn', 1,626,442 parameters). The
            real CIFAR-10 training set where --data-dir (or $FEDJAX_DP_DATA) holds it,
            standardised per channel as pfl does; else generated N(0, 1) images of
            its shape with uniform labels.
  femnist   3,400 writers (TFF's federated EMNIST count) of 28x28x1 images in [0, 1],
            62 classes, LEAF's FEMNIST CNN ('leaf_cnn', 6,603,710 parameters), with
            pfl's FEMNIST settings (its femnist.yaml trains its simple_cnn on the 10
            digits; this protocol keeps the cohort, batch, epoch and learning rates and
            trains LEAF's 62-class model). The writers' sizes are drawn from LEAF's
            FEMNIST size distribution (Caldas et al. 2018, table 1: mean 226.83,
            standard deviation 88.94 examples a writer; a gamma with those moments,
            fedjax_dp/data/sample_files.client_sizes), images uniform noise. Where
            --data-dir holds LEAF's FEMNIST files, 3,400 of its writers instead (all
            of them where the files hold fewer).

Every framework runs in a process of its own on the same arrays (written to a temporary
.npz) and starts from the same weights (fedjax-dp's initialisation, exported to an
.npz: flax's layouts, converted to torch's by protocol_peer.to_torch and renamed for
haiku). Each reports its initial loss on the same 20 examples, and the invocation
checks them against a NumPy forward pass of the exported weights
(protocol_peer.forward): the same model everywhere, or the run says which differs.
Each framework draws its own uniform cohorts, so on femnist its rounds' example
counts differ: the result has each one's examples a timed round beside the
seconds, and the ratio of seconds per example as well as of seconds per round.

Peers (--peers; default: each whose venv exists): pfl-research 0.6.0 (PyTorch) and
FedJAX 0.0.17 in benchmarks/peers/.venv-pfl and .venv-fedjax (built by
benchmarks/peers/setup_pfl.sh and setup_fedjax.sh); one without its venv is skipped
with the command that builds it. The machine's matmul rate (benchmarks/peak.py) is
measured in the same invocation, before the protocols and after them.

  python benchmarks/peer_protocols.py [--protocols cifar10 femnist] [--rounds 30 5]
      [--peer-rounds 10 3] [--peers pfl fedjax] [--data-dir DIR] [--quick] [--json OUT]

The result (stderr's tables, the JSON) has each framework's median and fastest
round, examples a round, achieved GFLOP/s (protocol_peer.train_flops x examples
over seconds) and its share of the matmul peak, its initial loss and whether it
is the reference's, and each peer's ratios to ours.

On a GPU: the same command with a CUDA jax in the project's Python (our side runs on
the GPU; the matmul rates then include TF32's), a CUDA torch in .venv-pfl (pfl puts
its model and the users' tensors on the GPU by itself) and a CUDA jaxlib in
.venv-fedjax (pip install jax[cuda12]==0.10.2 there): each framework then runs on the
card, and the result records each one's device. --quick first (100 clients, femnist's
of 20 examples, cohort 10, 2 timed rounds: under 3 minutes in all on 2 CPU cores)
checks the set-up for little device time.
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

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS_DIR = os.path.join(HERE, "peers")
sys.path.insert(0, HERE)
sys.path.insert(0, PEERS_DIR)

import protocol_peer as proto  # noqa: E402

# name: (venv folder, script, the command that builds the venv)
PEERS = {"pfl": (".venv-pfl", "pfl_protocols.py", "sh benchmarks/peers/setup_pfl.sh"),
         "fedjax": (".venv-fedjax", "fedjax_protocols.py", "sh benchmarks/peers/setup_fedjax.sh")}
CIFAR_USERS, CIFAR_PER_USER = 1000, 50    # pfl's cifar10_iid: 50,000 images in users of 50
FEMNIST_WRITERS = 3400
CHECK_EXAMPLES = 20
LOSS_RTOL = 1e-4     # float32 convolutions in three libraries against float64 NumPy


# ------------------------------------------------------------------------------- data

def _cifar10(data_dir, users: int, rng) -> tuple[np.ndarray, np.ndarray, str]:
  """users * 50 images: CIFAR-10's training set standardised per channel (pfl's
  load_and_preprocess) where it is found, else N(0, 1) images of its shape."""
  from fedjax_dp.data.images import find_cifar_folder, load_cifar10
  n = users * CIFAR_PER_USER
  folder, _ = find_cifar_folder(data_dir)
  if folder is not None:
    ds = load_cifar10(data_dir)
    x = ds.x_train
    x = ((x - x.mean(axis=(0, 1, 2))) / x.std(axis=(0, 1, 2))).astype(np.float32)
    if n > len(x):
      raise SystemExit(f"--clients {users}: CIFAR-10 holds {len(x)} images, "
                       f"{len(x) // CIFAR_PER_USER} users of {CIFAR_PER_USER}")
    return x, ds.y_train.astype(np.int32), f"CIFAR-10 ({folder})"
  x = rng.standard_normal((n,) + proto.PROTOCOLS["cifar10"][1], dtype=np.float32)
  return x, rng.integers(0, 10, n).astype(np.int32), "generated (CIFAR-10's shapes)"


def _femnist(data_dir, writers: int, mean_size: float, rng):
  """(x, y, per-writer row arrays, source): LEAF's FEMNIST writers where found,
  else generated writers of LEAF's size distribution."""
  from fedjax_dp.data.registry import DATASETS
  from fedjax_dp.data.sample_files import client_sizes
  found, where = DATASETS["femnist"].find(data_dir)
  if found:
    from fedjax_dp.data.natural import select_clients
    ds = DATASETS["femnist"].load(data_dir, 0)
    take = min(writers, len(ds.client_parts))
    ds = select_clients(ds, take, 0, 0)[0]
    return ds.x_train.astype(np.float32), ds.y_train.astype(np.int32), list(ds.client_parts), \
        f"LEAF FEMNIST ({where}, {take} writers)"
  sizes = client_sizes(writers, mean_size, rng)
  n = int(sizes.sum())
  x = rng.random((n,) + proto.PROTOCOLS["femnist"][1], dtype=np.float32)
  y = rng.integers(0, 62, n).astype(np.int32)
  ends = np.cumsum(sizes)
  return x, y, [np.arange(e - s, e) for s, e in zip(sizes, ends)], \
      f"generated ({writers} writers, LEAF's FEMNIST sizes)"


def write_data(protocol: str, path: str, *, clients: int | None = None, data_dir=None,
               mean_size: float | None = None, seed: int = 0) -> dict:
  """Writes the protocol's arrays in client order (protocol_peer's .npz) and returns
  what they are. `clients`: cifar10's users (default 1,000) or femnist's writers
  (3,400); `mean_size`: the generated writers' mean size (LEAF's 226.83)."""
  from fedjax_dp.data.sample_files import FEMNIST_MEAN
  rng = np.random.default_rng(seed)
  if protocol == "cifar10":
    users = clients or CIFAR_USERS
    x, y, source = _cifar10(data_dir, users, rng)
    order = rng.permutation(len(x))[:users * CIFAR_PER_USER]   # pfl: shuffle, cut in 50s
    parts = list(order.reshape(users, CIFAR_PER_USER))
  else:
    x, y, parts, source = _femnist(data_dir, clients or FEMNIST_WRITERS,
                                   mean_size or FEMNIST_MEAN, rng)
  order = np.concatenate(parts)
  sizes = np.array([len(p) for p in parts])
  starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
  x, y = x[order], y[order]
  np.savez(path, x=x, y=y, starts=starts, check_x=x[:CHECK_EXAMPLES],
           check_y=y[:CHECK_EXAMPLES])
  return {"source": source, "clients": len(parts), "examples": int(starts[-1]),
          "client_sizes": {"min": int(sizes.min()), "mean": round(float(sizes.mean()), 2),
                           "max": int(sizes.max())}}


def write_weights(protocol: str, path: str, seed: int = 0) -> int:
  """Our model's initialisation (seed `seed`) as flax-named arrays; returns the count."""
  import jax
  from fedjax_dp.models import make_model, num_params
  name, shape, classes = proto.PROTOCOLS[protocol]
  params = make_model(name, shape, classes).init(jax.random.PRNGKey(seed))
  np.savez(path, **{f"{layer}/{k}": np.asarray(v) for layer, leaves in params.items()
                    for k, v in leaves.items()})
  return int(num_params(params))


def reference_loss(protocol: str, data: str, weights: str) -> float:
  """The initial loss on the check batch from protocol_peer's NumPy forward pass."""
  name = proto.PROTOCOLS[protocol][0]
  with np.load(data) as f:   # the check batch alone (x may be gigabytes)
    check_x, check_y = f["check_x"], f["check_y"]
  return proto.cross_entropy(proto.forward(name, proto.load_weights(weights), check_x), check_y)


# ------------------------------------------------------------------------------- ours

def our_config(protocol: str, num_clients: int, cohort: int, parallelism: str = "auto",
               devices: int = 0):
  from fedjax_dp import make_config
  t = proto.TRAIN
  return make_config(dict(
      dataset="custom", model="custom", num_clients=num_clients, clients_per_round=cohort,
      sampling="fixed", algorithm="fedavg", local_epochs=t["epochs"], batch_size=t["batch"],
      lr=t["client_lr"], momentum=0.0, server_lr=t["server_lr"], rounds=1500, seed=0,
      client_parallelism=parallelism, devices=devices))


def run_ours(protocol: str, data: str, weights: str, rounds: int, *,
             cohort: int = proto.TRAIN["cohort"], parallelism: str = "auto",
             devices: int = 0) -> dict:
  """fedjax-dp's side, as a user with their own arrays writes it (data.from_arrays with
  the clients' rows, the built-in model, setup): one warm-up round (compilation
  included), then `rounds` rounds, each to block_until_ready."""
  import jax
  import jax.numpy as jnp
  from fedjax_dp.data import from_arrays
  from fedjax_dp.experiment.setup import setup
  from fedjax_dp.losses import cross_entropy
  from fedjax_dp.models import make_model
  t0 = time.perf_counter()
  name, shape, classes = proto.PROTOCOLS[protocol]
  x, y, starts, check_x, check_y = proto.load_data(data)
  n = len(starts) - 1
  parts = [np.arange(starts[i], starts[i + 1]) for i in range(n)]
  ds = from_arrays(x, y, partition=parts, test=(check_x, check_y), name=protocol)
  model = make_model(name, shape, classes)
  _, _, sim = setup(our_config(protocol, n, cohort, parallelism, devices), ds, model=model)
  state = sim.init_state()
  loaded = proto.load_weights(weights)
  params = {layer: {k: jax.device_put(jnp.asarray(loaded[f"{layer}/{k}"]), v.sharding)
                    for k, v in leaves.items()} for layer, leaves in state.params.items()}
  state = state._replace(params=params)
  initial_loss = float(jnp.mean(cross_entropy(model.apply(params, jnp.asarray(check_x)),
                                              jnp.asarray(check_y))))
  setup_s = time.perf_counter() - t0
  times, examples = [], []
  for _ in range(rounds + 1):
    t = time.perf_counter()
    state, stats = sim.run_rounds(state, 1)
    jax.block_until_ready(state.params)
    times.append(time.perf_counter() - t)
    examples.append(int(np.asarray(stats.examples).sum()))
  med = statistics.median(times[1:])
  return {"library": "fedjax-dp", "jax": jax.__version__, "device": str(jax.devices()[0]),
          "devices": int(sim.mesh.devices.size), "client_parallelism": sim.client_parallelism,
          "clients": n, "cohort": cohort, "protocol": protocol, "model": name,
          "setup_s": round(setup_s, 2), "warmup_round_s": round(times[0], 4),
          "round_s": [round(v, 4) for v in times[1:]], "median_round_s": round(med, 4),
          "initial_loss": initial_loss, "examples": examples[1:],
          "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


# ------------------------------------------------------------------------------ peers

def peer_python(name: str) -> str:
  return os.path.join(PEERS_DIR, PEERS[name][0], "bin", "python")


def skipped_peer(name: str) -> dict | None:
  """The result of a peer whose venv is absent (None where it is there)."""
  if os.path.exists(peer_python(name)):
    return None
  return {"library": name, "skipped": f"no venv ({os.path.relpath(peer_python(name))} is "
                                      f"missing): build it with {PEERS[name][2]}"}


def run_child(cmd: list[str], head: dict, timeout_s: int) -> dict:
  """The last JSON line of `cmd`'s output, or a failure record; with the machine's
  1-minute load average when it started (a busy machine slows every framework)."""
  head = {**head, "load_1m_before": round(os.getloadavg()[0], 2)}
  try:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
  except subprocess.TimeoutExpired:
    return {**head, "failed": f"did not finish within {timeout_s} s"}
  lines = [l for l in out.stdout.strip().splitlines() if l.startswith("{")]
  if out.returncode != 0 or not lines:
    return {**head, "failed": f"exit {out.returncode}: {out.stderr.strip().splitlines()[-3:]}"}
  return {**head, **json.loads(lines[-1])}


def run_peer(name: str, protocol: str, data: str, weights: str, rounds: int, cohort: int,
             timeout_s: int) -> dict:
  return run_child([peer_python(name), os.path.join(PEERS_DIR, PEERS[name][1]),
                    "--protocol", protocol, "--data", data, "--weights", weights,
                    "--rounds", str(rounds), "--cohort", str(cohort)],
                   {"library": name, "protocol": protocol}, timeout_s)


# ---------------------------------------------------------------------------- summary

def compare(ours: dict, others: list[dict], reference: float, flops_per_example: int = 0,
            peak_gflops: float = 0.0) -> list[dict]:
  """Each framework's median, examples a timed round, initial loss against the
  reference, achieved GFLOP/s (flops_per_example x examples over the timed rounds'
  seconds) and its share of `peak_gflops`, and each peer's ratios to ours (seconds
  per round and per example)."""
  rows = []
  per_example = lambda r: sum(r["round_s"]) / max(sum(r["examples"]), 1)
  for r in [ours] + others:
    if "median_round_s" not in r:
      rows.append({"library": r["library"], "not_run": r.get("skipped") or r.get("failed")})
      continue
    row = {"library": r["library"], "median_round_s": r["median_round_s"],
           "min_round_s": min(r["round_s"]),
           "mean_examples_per_round": round(statistics.mean(r["examples"]), 1),
           "initial_loss": round(r["initial_loss"], 6),
           "gflops": round(flops_per_example / per_example(r) / 1e9, 1),
           "same_initial_loss": abs(r["initial_loss"] - reference) <= LOSS_RTOL * max(
               1.0, abs(reference))}
    if peak_gflops:
      row["fraction_of_peak"] = round(row["gflops"] / peak_gflops, 3)
    if r is not ours and "median_round_s" in ours:
      row["ratio_round"] = round(r["median_round_s"] / ours["median_round_s"], 2)
      row["ratio_per_example"] = round(per_example(r) / per_example(ours), 2)
    rows.append(row)
  return rows


def main(argv=None):
  from cli_args import new_file, positive_int, write_results
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--protocols", nargs="+", default=["cifar10", "femnist"],
                  choices=sorted(proto.PROTOCOLS))
  ap.add_argument("--rounds", type=positive_int, nargs="+", default=None,
                  help="timed rounds after the warm-up, one count for all or one a protocol "
                       "(default 30 for cifar10, 5 for femnist)")
  ap.add_argument("--peers", nargs="*", default=None, choices=sorted(PEERS),
                  help="peers to run (default: each whose venv exists; none: --peers alone)")
  ap.add_argument("--data-dir", default=None,
                  help="folder holding CIFAR-10 (cifar-10-batches-py) or LEAF's FEMNIST")
  ap.add_argument("--clients", type=positive_int, default=None,
                  help="cifar10's users / femnist's writers (default 1,000 / 3,400)")
  ap.add_argument("--cohort", type=positive_int, default=None,
                  help="clients a round (the protocols' 50; smaller only for checks)")
  ap.add_argument("--peer-rounds", type=positive_int, nargs="+", default=None,
                  help="the peers' timed rounds, as --rounds (default: --rounds)")
  ap.add_argument("--parallelism", default="auto", choices=["auto", "map", "vmap"],
                  help="our client path")
  ap.add_argument("--timeout", type=positive_int, default=1800, help="seconds per framework")
  ap.add_argument("--quick", action="store_true",
                  help="a check of the set-up: 100 clients of 20 (femnist), cohort 10, 2 "
                       "timed rounds")
  ap.add_argument("--json", default=None, type=new_file,
                  help="write the results here too (refuses an existing file)")
  ap.add_argument("--ours", nargs=4, metavar=("PROTOCOL", "DATA", "WEIGHTS", "ROUNDS"),
                  help=argparse.SUPPRESS)
  ap.add_argument("--write-data", nargs=3, metavar=("PROTOCOL", "PATH", "CLIENTS"),
                  help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.ours:   # the child that times our side
    from fedjax_dp.placement.host import use_cpu_devices_or_exit
    use_cpu_devices_or_exit()   # as the CLI does: one XLA CPU device per core
    protocol, data, weights, rounds = args.ours
    print(json.dumps(run_ours(protocol, data, weights, int(rounds),
                              cohort=args.cohort or proto.TRAIN["cohort"],
                              parallelism=args.parallelism)))
    return
  if args.write_data:   # a child, so that this process stays small
    protocol, path, clients = args.write_data
    print(json.dumps(write_data(protocol, path, clients=int(clients) or None,
                                data_dir=args.data_dir,
                                mean_size=20 if args.quick else None)))
    return
  defaults = {"cifar10": 30, "femnist": 5}
  if args.quick:
    defaults = {"cifar10": 2, "femnist": 2}
    args.clients, args.cohort = args.clients or 100, args.cohort or 10
  cohort = args.cohort or proto.TRAIN["cohort"]
  pick = lambda counts, i, p: counts[min(i, len(counts) - 1)] if counts else defaults[p]
  rounds = {p: pick(args.rounds, i, p) for i, p in enumerate(args.protocols)}
  peer_rounds = {p: pick(args.peer_rounds, i, p) if args.peer_rounds else rounds[p]
                 for i, p in enumerate(args.protocols)}
  peers = ([n for n in PEERS if os.path.exists(peer_python(n))] if args.peers is None
           else args.peers)
  for name in peers:
    if not os.path.exists(peer_python(name)):
      ap.error(f"--peers {name}: {peer_python(name)} is missing; build it with {PEERS[name][2]}")
  absent = [skipped_peer(n) for n in sorted(set(PEERS) - set(peers))] if args.peers is None \
      else []
  for a in absent:
    print(f"{a['library']}: skipped, {a['skipped']}", file=sys.stderr, flush=True)

  from peak import measure_matmul_peak
  import jax
  peaks = [measure_matmul_peak()]
  print(f"matmul: {json.dumps(peaks[0])}", file=sys.stderr, flush=True)
  results = {}
  for protocol in args.protocols:
    with tempfile.TemporaryDirectory() as tmp:
      data, weights = os.path.join(tmp, "data.npz"), os.path.join(tmp, "weights.npz")
      info = run_child([sys.executable, __file__, "--write-data", protocol, data,
                        str(args.clients or 0)] +
                       (["--data-dir", args.data_dir] if args.data_dir else []) +
                       (["--quick"] if args.quick else []),
                       {}, args.timeout)
      if "failed" in info:
        raise SystemExit(f"{protocol}: writing the data failed: {info['failed']}")
      info["params"] = write_weights(protocol, weights)
      reference = reference_loss(protocol, data, weights)
      print(f"{protocol}: {json.dumps(info)}; reference initial loss {reference:.6f}",
            file=sys.stderr, flush=True)
      runs = [run_child([sys.executable, __file__, "--ours", protocol, data, weights,
                         str(rounds[protocol]), "--parallelism", args.parallelism,
                         "--cohort", str(cohort)],
                        {"library": "fedjax-dp", "protocol": protocol}, args.timeout)]
      print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
      for name in peers:
        runs.append(run_peer(name, protocol, data, weights, peer_rounds[protocol], cohort,
                             args.timeout))
        print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    name, shape, classes = proto.PROTOCOLS[protocol]
    info["train_flops_per_example"] = proto.train_flops(name, shape, classes)
    table = compare(runs[0], runs[1:] + absent, reference, info["train_flops_per_example"],
                    peaks[0]["peak_gflops"])
    results[protocol] = {"data": info, "train": proto.TRAIN, "model": name,
                         "cohort": cohort, "timed_rounds": rounds[protocol],
                         "peer_timed_rounds": peer_rounds[protocol],
                         "reference_initial_loss": reference,
                         "table": table, "runs": runs}
    print(f"\n{protocol} ({info['source']}; {info['params']:,} parameters)\n"
          "| framework | median s / round | examples / round | GFLOP/s (of peak) | initial loss "
          "| same model | peer / ours (round) | peer / ours (per example) |\n| --- | --- | --- "
          "| --- | --- | --- | --- | --- |", file=sys.stderr)
    for row in table:
      if "not_run" in row:
        print(f"| {row['library']} | not run: {row['not_run']} | | | | | | |", file=sys.stderr)
      else:
        print(f"| {row['library']} | {row['median_round_s']} | {row['mean_examples_per_round']}"
              f" | {row['gflops']} ({row.get('fraction_of_peak', 0):.0%}) | "
              f"{row['initial_loss']} | {'yes' if row['same_initial_loss'] else 'NO'} | "
              f"{row.get('ratio_round', '')} | {row.get('ratio_per_example', '')} |",
              file=sys.stderr, flush=True)
  peaks.append(measure_matmul_peak())
  result = {"machine": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d %H:%M"), "command": " ".join(sys.argv),
            "backend": jax.default_backend(), "matmul": peaks,
            "peak_gflops": max(p["peak_gflops"] for p in peaks), "quick": args.quick,
            "protocols": results}
  print(json.dumps(result, indent=2))
  if args.json:
    write_results(result, args.json)
  if any(not row.get("same_initial_loss", True) for r in results.values() for row in r["table"]):
    raise SystemExit("initial losses differ: the frameworks do not train the same model "
                     "(see the table)")


if __name__ == "__main__":
  main()
