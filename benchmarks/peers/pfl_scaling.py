"""pfl-research 0.6.0 (PyTorch backend) on benchmarks/scaling.py's stateless and
stateful protocols (scaling_peer.py).

Written as a pfl user would: a FederatedDataset whose make_dataset_fn slices a client's
rows, a uniform random user sampler, pfl.algorithm.FederatedAveraging (or, with
--algorithm scaffold, pfl.algorithm.SCAFFOLD, option II, the control variates in an
InMemoryUserStateStorage) on a SimulatedBackend (no postprocessors: no DP), a
PyTorchModel of a torch MLP with SGD as the local (lr 0.05) and central (lr 1)
optimizers, NNTrainHyperParams(1 epoch, batch 64). Central evaluation off. A round is
one central iteration, timed between pfl's own after_central_iteration callbacks (the
first from on_train_begin).

  benchmarks/peers/.venv-pfl/bin/python benchmarks/peers/pfl_scaling.py \\
      --data DATA.npz --cohort 10000 --rounds 3 [--algorithm scaffold]
"""

import os
import sys
from importlib.metadata import version

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scaling_peer as peer  # noqa: E402

from pfl.aggregate.simulate import SimulatedBackend  # noqa: E402
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams  # noqa: E402
from pfl.algorithm.scaffold import SCAFFOLD, SCAFFOLDParams  # noqa: E402
from pfl.callback.base import TrainingProcessCallback  # noqa: E402
from pfl.data.dataset import Dataset  # noqa: E402
from pfl.data.federated_dataset import FederatedDataset  # noqa: E402
from pfl.data.sampling import get_user_sampler  # noqa: E402
from pfl.data.user_state import InMemoryUserStateStorage  # noqa: E402
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams  # noqa: E402
from pfl.metrics import Metrics, Weighted  # noqa: E402
from pfl.model.pytorch import PyTorchModel  # noqa: E402


class MLP(torch.nn.Module):
  """The MLP 32-64-10, with the loss and metrics pfl's PyTorchModel asks for."""

  def __init__(self):
    super().__init__()
    self.net = torch.nn.Sequential(torch.nn.Linear(peer.FEATURES, peer.HIDDEN), torch.nn.ReLU(),
                                   torch.nn.Linear(peer.HIDDEN, peer.CLASSES))

  def forward(self, x):
    return self.net(x)

  def loss(self, x, y, eval=False):
    self.eval() if eval else self.train()
    return torch.nn.functional.cross_entropy(self(x), y)

  @torch.no_grad()
  def metrics(self, x, y, eval=False):
    loss = torch.nn.functional.cross_entropy(self(x), y, reduction="sum").item()
    return {"loss": Weighted(loss, len(x))}


class RoundClock(TrainingProcessCallback):
  def __init__(self, clock):
    self.clock = clock

  def on_train_begin(self, *, model):
    self.clock.setup_done()
    self.clock.start()
    return Metrics()

  def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
    self.clock.stop()
    self.clock.start()
    return False, Metrics()


def main(argv=None):
  args = peer.parse_args(__doc__.splitlines()[0], argv, algorithms=("fedavg", "scaffold"))
  clock = peer.Clock()
  torch.manual_seed(0)
  np.random.seed(0)
  x, y, starts = peer.load(args.data)
  x, y = torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))
  n = len(starts) - 1

  def make_dataset(user):
    return Dataset((x[starts[user]:starts[user + 1]], y[starts[user]:starts[user + 1]]),
                   user_id=str(user))
  users = list(range(n))
  train = FederatedDataset(make_dataset, get_user_sampler("random", users))
  val = FederatedDataset(make_dataset, get_user_sampler("random", users))
  module = MLP()
  model = PyTorchModel(module, local_optimizer_create=torch.optim.SGD,
                       central_optimizer=torch.optim.SGD(module.parameters(), peer.SERVER_LR))
  common = dict(central_num_iterations=args.rounds + 1, evaluation_frequency=args.rounds + 10,
                train_cohort_size=args.cohort, val_cohort_size=0)
  if args.algorithm == "scaffold":
    algorithm = SCAFFOLD()
    params = SCAFFOLDParams(**common, population=n, use_gradient_as_control_variate=False,
                            user_state_storage=InMemoryUserStateStorage())
  else:
    algorithm, params = FederatedAveraging(), NNAlgorithmParams(**common)
  algorithm.run(
      algorithm_params=params,
      backend=SimulatedBackend(training_data=train, val_data=val),
      model=model,
      model_train_params=NNTrainHyperParams(local_num_epochs=1,
                                            local_learning_rate=peer.CLIENT_LR,
                                            local_batch_size=peer.BATCH),
      model_eval_params=NNEvalHyperParams(local_batch_size=peer.BATCH),
      callbacks=[RoundClock(clock)], send_metrics_to_platform=False)
  clock.rounds = clock.rounds[:args.rounds + 1]
  peer.emit(peer.result("pfl-research", {"pfl": version("pfl"), "torch": torch.__version__,
                                         "torch_threads": torch.get_num_threads()},
                        n, args.cohort, clock, algorithm=args.algorithm))


if __name__ == "__main__":
  main()
