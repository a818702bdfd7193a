"""FedJAX 0.0.17 on benchmarks/peer_protocols.py's protocols (protocol_peer.py).

Written as a FedJAX user would (its EMNIST example's pieces): fedjax.InMemoryFederatedData
of the clients, a UniformGetClientSampler drawing the cohort of 50, fed_avg with a haiku
module of the protocol's model (hk.Conv2D / hk.Linear, NHWC as flax: the .npz's initial
weights go in unchanged, only renamed), client SGD lr 0.1 and server SGD lr 1.0,
ShuffleRepeatBatchHParams(batch_size=10, num_epochs=1), FedJAX's default (jit)
for_each_client backend on JAX's default device (the GPU where the venv's jaxlib has
CUDA). A round is sample() plus apply(), ended by block_until_ready on the server params.

  benchmarks/peers/.venv-fedjax/bin/python benchmarks/peers/fedjax_protocols.py \\
      --protocol cifar10 --data DATA.npz --weights INIT.npz --rounds 30
"""

import os
import sys
from importlib.metadata import version

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol_peer as proto  # noqa: E402
import scaling_peer as peer  # noqa: E402

if not hasattr(jax, "tree_map"):  # fedjax 0.0.17 calls jax.tree_map, which current JAX removed
  jax.tree_map = jax.tree.map

import fedjax  # noqa: E402
import haiku as hk  # noqa: E402
from fedjax.algorithms import fed_avg  # noqa: E402


def haiku_forward(model: str, classes: int):
  """protocol_peer.LAYERS[model] as a haiku forward pass, and {flax name: haiku module
  name} (haiku names its modules conv2_d, conv2_d_1, linear, linear_1 in call order)."""
  names, counts = {}, {"conv": 0, "dense": 0}
  for layer in proto.LAYERS[model]:
    if layer[0] in counts:
      base = "conv2_d" if layer[0] == "conv" else "linear"
      i = counts[layer[0]]
      names[layer[1]] = base if i == 0 else f"{base}_{i}"
      counts[layer[0]] += 1

  def forward(batch):
    x = batch["x"]
    for layer in proto.LAYERS[model]:
      kind = layer[0]
      if kind == "conv":
        x = hk.Conv2D(layer[2], layer[3], padding=layer[4])(x)
      elif kind == "dense":
        x = hk.Linear(layer[2] or classes)(x)
      elif kind == "relu":
        x = jax.nn.relu(x)
      elif kind == "pool":
        x = hk.max_pool(x, window_shape=(1, 2, 2, 1), strides=(1, 2, 2, 1), padding="VALID")
      else:
        x = hk.Flatten()(x)
    return x
  return forward, names


def main(argv=None):
  args = proto.parse_args(__doc__.splitlines()[0], argv)
  clock = peer.Clock()
  model_name, shape, classes = proto.PROTOCOLS[args.protocol]
  x, y, starts, check_x, check_y = proto.load_data(args.data)
  n = len(starts) - 1
  fd = fedjax.InMemoryFederatedData({
      f"{c:07d}".encode(): {"x": x[starts[c]:starts[c + 1]], "y": y[starts[c]:starts[c + 1]]}
      for c in range(n)})
  forward, names = haiku_forward(model_name, classes)
  model = fedjax.create_model_from_haiku(
      hk.transform(forward), {"x": x[:1]},
      train_loss=lambda b, preds: fedjax.metrics.unreduced_cross_entropy_loss(b["y"], preds))
  weights = proto.load_weights(args.weights)
  params = model.init(jax.random.PRNGKey(0))
  params = hk.data_structures.to_immutable_dict({
      names[layer]: {k: jnp.asarray(weights[f"{layer}/{'kernel' if k == 'w' else 'bias'}"])
                     for k in params[names[layer]]} for layer in names})
  logits = model.apply_for_eval(params, {"x": check_x})
  initial_loss = float(fedjax.metrics.unreduced_cross_entropy_loss(check_y, logits).mean())
  algorithm = fed_avg.federated_averaging(
      fedjax.model_grad(model), fedjax.optimizers.sgd(proto.TRAIN["client_lr"]),
      fedjax.optimizers.sgd(proto.TRAIN["server_lr"]),
      fedjax.ShuffleRepeatBatchHParams(batch_size=proto.TRAIN["batch"],
                                       num_epochs=proto.TRAIN["epochs"]))
  state = algorithm.init(params)
  sampler = fedjax.client_samplers.UniformGetClientSampler(fd, args.cohort, 0)
  clock.setup_done()
  examples = []
  for _ in range(args.rounds + 1):
    clock.start()
    clients = sampler.sample()
    state, _ = algorithm.apply(state, clients)
    jax.block_until_ready(state.params)
    clock.stop()
    examples.append(sum(len(c[1]) for c in clients))
  peer.emit(peer.result("fedjax", {"fedjax": version("fedjax"), "jax": jax.__version__,
                                   "device": str(jax.devices()[0])},
                        n, args.cohort, clock, protocol=args.protocol,
                        model=model_name, initial_loss=initial_loss, examples=examples[1:]))


if __name__ == "__main__":
  main()
