"""FedJAX 0.0.17 on benchmarks/scaling.py's stateless protocol (scaling_peer.py).

Written as a FedJAX user would: fedjax.InMemoryFederatedData of the N clients, a
UniformGetClientSampler drawing the cohort, fedjax.algorithms.fed_avg with a haiku MLP,
ShuffleRepeatBatchHParams(batch_size=64, num_epochs=1), FedJAX's default (jit)
for_each_client backend on JAX's default CPU device. A round is sample() plus apply(),
ended by block_until_ready on the server params.

  benchmarks/peers/.venv-fedjax/bin/python benchmarks/peers/fedjax_scaling.py \\
      --data DATA.npz --cohort 10000 --rounds 3
"""

import os
import sys
from importlib.metadata import version

import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scaling_peer as peer  # noqa: E402

if not hasattr(jax, "tree_map"):  # fedjax 0.0.17 calls jax.tree_map, which current JAX removed
  jax.tree_map = jax.tree.map

import fedjax  # noqa: E402
import haiku as hk  # noqa: E402
from fedjax.algorithms import fed_avg  # noqa: E402


def main(argv=None):
  args = peer.parse_args(__doc__.splitlines()[0], argv)
  clock = peer.Clock()
  x, y, starts = peer.load(args.data)
  n = len(starts) - 1
  fd = fedjax.InMemoryFederatedData({
      f"{c:07d}".encode(): {"x": x[starts[c]:starts[c + 1]], "y": y[starts[c]:starts[c + 1]]}
      for c in range(n)})

  def forward(batch):
    return hk.nets.MLP([peer.HIDDEN, peer.CLASSES], activation=jax.nn.relu)(batch["x"])
  model = fedjax.create_model_from_haiku(
      hk.transform(forward), {"x": x[:1]},
      train_loss=lambda b, preds: fedjax.metrics.unreduced_cross_entropy_loss(b["y"], preds))
  algorithm = fed_avg.federated_averaging(
      fedjax.model_grad(model), fedjax.optimizers.sgd(peer.CLIENT_LR),
      fedjax.optimizers.sgd(peer.SERVER_LR),
      fedjax.ShuffleRepeatBatchHParams(batch_size=peer.BATCH, num_epochs=1))
  state = algorithm.init(model.init(jax.random.PRNGKey(0)))
  sampler = fedjax.client_samplers.UniformGetClientSampler(fd, args.cohort, 0)
  clock.setup_done()
  for _ in range(args.rounds + 1):
    clock.start()
    state, _ = algorithm.apply(state, sampler.sample())
    jax.block_until_ready(state.params)
    clock.stop()
  peer.emit(peer.result("fedjax", {"fedjax": version("fedjax"), "jax": jax.__version__},
                        n, args.cohort, clock))


if __name__ == "__main__":
  main()
