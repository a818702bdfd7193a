"""pfl-research 0.6.0 (PyTorch backend) on benchmarks/peer_protocols.py's protocols
(protocol_peer.py).

Written as pfl's own image-classification benchmark is (benchmarks/image_classification
/pytorch/train.py there): FederatedDataset.from_slices of the users' tensors (pfl's
to_tensor: on the GPU where torch has one) with the 'random' user sampler, a torch
module of the protocol's model (NHWC batches transposed to NCHW first, as pfl's
simple_cnn does) in a PyTorchModel with SGD as the local (lr 0.1) and central (lr 1.0)
optimizers, FederatedAveraging on a SimulatedBackend with WeightByDatapoints as its
only postprocessor (no DP), NNTrainHyperParams(1 epoch, batch 10), central evaluation
off. A round is one central iteration, timed between pfl's own callbacks
(pfl_scaling.RoundClock). The initial weights are the .npz's, converted to torch's
layouts (protocol_peer.to_torch).

  benchmarks/peers/.venv-pfl/bin/python benchmarks/peers/pfl_protocols.py \\
      --protocol cifar10 --data DATA.npz --weights INIT.npz --rounds 30
"""

import os
import sys
from importlib.metadata import version

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol_peer as proto  # noqa: E402
import scaling_peer as peer  # noqa: E402
from pfl_scaling import RoundClock  # noqa: E402

from pfl.aggregate.simulate import SimulatedBackend  # noqa: E402
from pfl.aggregate.weighting import WeightByDatapoints  # noqa: E402
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams  # noqa: E402
from pfl.data.federated_dataset import FederatedDataset  # noqa: E402
from pfl.data.sampling import get_user_sampler  # noqa: E402
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams  # noqa: E402
from pfl.internal.ops.pytorch_ops import get_default_device, to_tensor  # noqa: E402
from pfl.metrics import Weighted  # noqa: E402
from pfl.model.pytorch import PyTorchModel  # noqa: E402


class Net(torch.nn.Module):
  """protocol_peer.LAYERS[model] in torch, with the loss and metrics PyTorchModel asks for."""

  def __init__(self, model: str, input_shape, classes: int):
    super().__init__()
    self.layers = proto.LAYERS[model]
    for layer, seen in proto.shapes(model, input_shape):
      if layer[0] == "conv":
        _, name, out, k, padding = layer
        self.add_module(name, torch.nn.Conv2d(seen[2], out, k,
                                              padding=0 if padding == "VALID" else k // 2))
      elif layer[0] == "dense":
        self.add_module(layer[1], torch.nn.Linear(seen[0], layer[2] or classes))

  def forward(self, x):
    x = x.permute(0, 3, 1, 2)
    for layer in self.layers:
      kind = layer[0]
      if kind in ("conv", "dense"):
        x = getattr(self, layer[1])(x)
      elif kind == "relu":
        x = F.relu(x)
      elif kind == "pool":
        x = F.max_pool2d(x, 2)
      else:
        x = torch.flatten(x, 1)
    return x

  def loss(self, x, y, eval=False):
    self.eval() if eval else self.train()
    return F.cross_entropy(self(x), y.long())

  @torch.no_grad()
  def metrics(self, x, y, eval=True):
    return {"loss": Weighted(F.cross_entropy(self(x), y.long(), reduction="sum").item(), len(x))}


def main(argv=None):
  args = proto.parse_args(__doc__.splitlines()[0], argv)
  clock = peer.Clock()
  torch.manual_seed(0)
  np.random.seed(0)
  model_name, shape, classes = proto.PROTOCOLS[args.protocol]
  x, y, starts, check_x, check_y = proto.load_data(args.data)
  n = len(starts) - 1
  sizes = np.diff(starts)
  xt, yt = to_tensor(x), to_tensor(y.astype(np.int64))
  users = [[xt[starts[u]:starts[u + 1]], yt[starts[u]:starts[u + 1]]] for u in range(n)]
  drawn: list[int] = []
  random_user = get_user_sampler("random", list(range(n)))

  def sampler():   # pfl's 'random' sampler, noting each user's examples
    user = random_user()
    drawn.append(int(sizes[user]))
    return user
  train = FederatedDataset.from_slices(users, sampler)
  val = FederatedDataset.from_slices(users, get_user_sampler("random", list(range(n))))

  module = Net(model_name, shape, classes)
  module.load_state_dict({k: torch.from_numpy(v) for k, v in proto.to_torch(
      model_name, shape, proto.load_weights(args.weights)).items()})
  module.to(get_default_device())
  with torch.no_grad():
    initial_loss = module.loss(to_tensor(check_x), to_tensor(check_y.astype(np.int64)),
                               eval=True).item()
  model = PyTorchModel(module, local_optimizer_create=torch.optim.SGD,
                       central_optimizer=torch.optim.SGD(module.parameters(),
                                                         proto.TRAIN["server_lr"]))
  examples: list[int] = []

  class Counted(RoundClock):
    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
      examples.append(sum(drawn))
      drawn.clear()
      return super().after_central_iteration(aggregate_metrics, model,
                                             central_iteration=central_iteration)

  FederatedAveraging().run(
      algorithm_params=NNAlgorithmParams(
          central_num_iterations=args.rounds + 1, evaluation_frequency=args.rounds + 10,
          train_cohort_size=args.cohort, val_cohort_size=0),
      backend=SimulatedBackend(training_data=train, val_data=val,
                               postprocessors=[WeightByDatapoints()]),
      model=model,
      model_train_params=NNTrainHyperParams(local_num_epochs=proto.TRAIN["epochs"],
                                            local_learning_rate=proto.TRAIN["client_lr"],
                                            local_batch_size=proto.TRAIN["batch"]),
      model_eval_params=NNEvalHyperParams(local_batch_size=proto.TRAIN["batch"]),
      callbacks=[Counted(clock)], send_metrics_to_platform=False)
  clock.rounds = clock.rounds[:args.rounds + 1]
  peer.emit(peer.result(
      "pfl-research", {"pfl": version("pfl"), "torch": torch.__version__,
                       "torch_threads": torch.get_num_threads(),
                       "device": str(get_default_device())},
      n, args.cohort, clock, protocol=args.protocol, model=model_name,
      initial_loss=initial_loss, examples=examples[1:args.rounds + 1]))


if __name__ == "__main__":
  main()
