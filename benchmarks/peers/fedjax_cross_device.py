"""FedJAX 0.0.17 on our cross-device FedAvg protocols: seconds per round.

The peer for benchmarks/cross_device.py, written as a FedJAX user would
write it: Fashion-MNIST's 60,000 training examples split iid into N equal
clients (N = 10000, 1000, 100: 6, 60, 600 examples each) held in
fedjax.InMemoryFederatedData; every client every round (a
UniformGetClientSampler drawing all N without replacement); FedJAX's own
fedjax.algorithms.fed_avg with a haiku MLP 784-200-200-10 (ReLU, 199,210
params), client batching ShuffleRepeatBatchHParams(batch_size=64,
num_epochs=1) (the last short batch kept), client SGD lr 0.01 momentum 0.5,
server SGD lr 1.0, FedJAX's default (jit) for_each_client backend on JAX's
default CPU device.

A round is the sampler's sample() plus fed_avg's apply(), ended by
jax.block_until_ready on the server params; one warm-up round (compilation)
then the median of --rounds timed rounds. Fashion-MNIST comes from the same
IDX files fedjax_dp finds (--data-dir, $FEDJAX_DP_DATA, ~/.cache, ~/data,
~/.keras/datasets and their fmnist subfolders, then the Debian package
dataset-fashion-mnist at /usr/share/datasets/fashion-mnist).

  sh benchmarks/peers/setup_fedjax.sh          # builds benchmarks/peers/.venv-fedjax
  benchmarks/peers/.venv-fedjax/bin/python benchmarks/peers/fedjax_cross_device.py \\
      --clients 10000 1000 100 --rounds 3 --json OUT.json
"""

import argparse
import gzip
import json
import os
import statistics
import sys
import time
from importlib.metadata import version

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cli_args import new_file, write_results  # noqa: E402  (benchmarks/cli_args.py: stdlib only)

if not hasattr(jax, "tree_map"):  # fedjax 0.0.17 calls jax.tree_map, which current JAX removed
  jax.tree_map = jax.tree.map

import fedjax  # noqa: E402
import haiku as hk  # noqa: E402
from fedjax.algorithms import fed_avg  # noqa: E402

SUBDIRS = ("", "fmnist", "fashion-mnist", "fashion_mnist", "FashionMNIST", "FashionMNIST/raw")
DEBIAN_FMNIST = "/usr/share/datasets/fashion-mnist"
TRAIN = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte")


def find_file(folder, stem):
  for name in (stem, stem + ".gz"):
    if os.path.isfile(os.path.join(folder, name)):
      return os.path.join(folder, name)
  return None


def read_idx(path):
  """An IDX file: big-endian magic (0x0000 0x08 ndim), then one uint32 per dim, then uint8s."""
  with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
    raw = f.read()
  ndim = raw[3]
  shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, 4))
  return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_fmnist_train(data_dir):
  home = os.path.expanduser("~")
  roots = [data_dir, os.environ.get("FEDJAX_DP_DATA"), os.path.join(home, ".cache"),
           os.path.join(home, "data"), os.path.join(home, ".keras", "datasets")]
  folders = [os.path.join(os.path.expanduser(r), s) for r in roots if r for s in SUBDIRS]
  for folder in folders + [DEBIAN_FMNIST]:
    paths = [find_file(folder, stem) for stem in TRAIN]
    if all(paths):
      x, y = map(read_idx, paths)
      return x.reshape(len(x), -1).astype(np.float32) / 255.0, y.astype(np.int32)
  sys.exit(f"Fashion-MNIST training IDX files not found in {folders + [DEBIAN_FMNIST]}")


def make_model(sample_x):
  def forward(batch):  # fedjax hands haiku the whole batch dict
    return hk.nets.MLP([200, 200, 10], activation=jax.nn.relu)(hk.Flatten()(batch["x"]))
  return fedjax.create_model_from_haiku(
      hk.transform(forward), {"x": sample_x},
      train_loss=lambda b, preds: fedjax.metrics.unreduced_cross_entropy_loss(b["y"], preds))


def time_protocol(x, y, num_clients, rounds, seed=0):
  per_client = len(x) // num_clients
  order = np.random.default_rng(seed).permutation(len(x))[:per_client * num_clients]
  fd = fedjax.InMemoryFederatedData({
      f"{c:05d}".encode(): {"x": x[idx], "y": y[idx]}
      for c, idx in enumerate(order.reshape(num_clients, per_client))})
  model = make_model(x[:1])
  params = model.init(jax.random.PRNGKey(seed))
  num_params = sum(int(l.size) for l in jax.tree_util.tree_leaves(params))
  algorithm = fed_avg.federated_averaging(
      fedjax.model_grad(model), fedjax.optimizers.sgd(0.01, momentum=0.5),
      fedjax.optimizers.sgd(1.0),
      fedjax.ShuffleRepeatBatchHParams(batch_size=64, num_epochs=1))
  state = algorithm.init(params)
  sampler = fedjax.client_samplers.UniformGetClientSampler(fd, num_clients, seed)

  def one_round(state):
    t = time.perf_counter()
    clients = sampler.sample()
    t_sampled = time.perf_counter()
    state, _ = algorithm.apply(state, clients)
    jax.block_until_ready(state.params)
    return state, time.perf_counter() - t, t_sampled - t

  state, warmup_s, _ = one_round(state)
  times, sample_times = [], []
  for _ in range(rounds):
    state, dt, ds = one_round(state)
    times, sample_times = times + [dt], sample_times + [ds]
  return {"num_clients": num_clients, "examples_per_client": per_client,
          "examples_per_round": per_client * num_clients, "num_params": num_params,
          "warmup_round_s": round(warmup_s, 3), "round_s": [round(t, 4) for t in times],
          "median_round_s": round(statistics.median(times), 4),
          "sample_s": [round(t, 4) for t in sample_times]}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--clients", type=int, nargs="+", default=[10000, 1000, 100],
                  help="N for each protocol: 60000 / N examples per client")
  ap.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up round")
  ap.add_argument("--data-dir", default=None)
  ap.add_argument("--json", default=None, type=new_file,
                  help="write the results here too (refuses an existing file)")
  args = ap.parse_args(argv)
  if args.rounds < 1 or any(n < 1 for n in args.clients):
    ap.error("--rounds and --clients must be positive")
  x, y = load_fmnist_train(args.data_dir)
  runs = {f"{n}x{len(x) // n}": time_protocol(x, y, n, args.rounds) for n in args.clients}
  result = {"library": "fedjax", "fedjax": version("fedjax"), "jax": jax.__version__,
            "jaxlib": version("jaxlib"), "dm-haiku": version("dm-haiku"),
            "devices": [str(d) for d in jax.devices()], "cpu_count": os.cpu_count(),
            "protocol": dict(dataset="fmnist", partition="iid", model="mlp 784-200-200-10",
                             local_epochs=1, batch_size=64, client_lr=0.01, momentum=0.5,
                             server_lr=1.0, sampling="every client every round"),
            "runs": runs}
  print(json.dumps(result, indent=2))
  if args.json:
    write_results(result, args.json)


if __name__ == "__main__":
  main()
