"""Flower 1.41 (simulation runtime, Ray backend) on benchmarks/scaling.py's stateless
protocol (scaling_peer.py).

Written as a Flower user would: run_simulation with N supernodes, a ClientApp whose
NumPyClient trains a torch MLP on its partition's rows (SGD lr 0.05, batch 64, one
epoch) and returns its weights and example count, a ServerApp with Flower's FedAvg
strategy sampling the cohort (fraction_fit = C / N, min_fit_clients = C) and no
evaluation. One CPU per client actor (2 actors on 2 cores). A round is timed from the
strategy's configure_fit to the end of its aggregate_fit. peak_rss_mb is the driver's:
the Ray actors are other processes.

  benchmarks/peers/.venv-flower/bin/python benchmarks/peers/flower_scaling.py \\
      --data DATA.npz --cohort 10000 --rounds 3
"""

import os
import sys
from importlib.metadata import version

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scaling_peer as peer  # noqa: E402

from flwr.client import ClientApp, NumPyClient  # noqa: E402
from flwr.common import Context, ndarrays_to_parameters  # noqa: E402
from flwr.server import ServerApp, ServerAppComponents, ServerConfig  # noqa: E402
from flwr.server.strategy import FedAvg  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402

DATA_ENV = "FEDJAX_DP_SCALING_PEER_DATA"
_data = {}


def mlp() -> torch.nn.Module:
  return torch.nn.Sequential(torch.nn.Linear(peer.FEATURES, peer.HIDDEN), torch.nn.ReLU(),
                             torch.nn.Linear(peer.HIDDEN, peer.CLASSES))


def weights(model) -> list[np.ndarray]:
  return [p.detach().numpy().copy() for p in model.parameters()]


class Client(NumPyClient):
  def __init__(self, x, y):
    self.x, self.y, self.model = x, y, mlp()

  def fit(self, parameters, config):
    with torch.no_grad():
      for p, w in zip(self.model.parameters(), parameters):
        p.copy_(torch.from_numpy(w))
    opt = torch.optim.SGD(self.model.parameters(), lr=peer.CLIENT_LR)
    for i in range(0, len(self.x), peer.BATCH):
      opt.zero_grad()
      torch.nn.functional.cross_entropy(self.model(self.x[i:i + peer.BATCH]),
                                        self.y[i:i + peer.BATCH]).backward()
      opt.step()
    return weights(self.model), len(self.x), {}


def client_fn(context: Context):
  if not _data:   # once per actor process
    x, y, starts = peer.load(os.environ[DATA_ENV])
    _data.update(x=torch.from_numpy(x), y=torch.from_numpy(y.astype(np.int64)), starts=starts)
  c, s = int(context.node_config["partition-id"]), _data["starts"]
  return Client(_data["x"][s[c]:s[c + 1]], _data["y"][s[c]:s[c + 1]]).to_client()


class TimedFedAvg(FedAvg):
  def __init__(self, clock, **kw):
    super().__init__(**kw)
    self.clock = clock

  def configure_fit(self, server_round, parameters, client_manager):
    if server_round == 1:
      self.clock.setup_done()
    self.clock.start()
    return super().configure_fit(server_round, parameters, client_manager)

  def aggregate_fit(self, server_round, results, failures):
    out = super().aggregate_fit(server_round, results, failures)
    self.clock.stop()
    if failures:
      raise RuntimeError(f"round {server_round}: {len(failures)} clients failed: {failures[:1]}")
    return out


def main(argv=None):
  args = peer.parse_args(__doc__.splitlines()[0], argv)
  clock = peer.Clock()
  torch.manual_seed(0)
  os.environ[DATA_ENV] = os.path.abspath(args.data)
  with np.load(args.data) as f:
    n = len(f["starts"]) - 1
  strategy = TimedFedAvg(
      clock, fraction_fit=args.cohort / n, min_fit_clients=args.cohort,
      min_available_clients=args.cohort, fraction_evaluate=0.0, min_evaluate_clients=0,
      initial_parameters=ndarrays_to_parameters(weights(mlp())))
  server = ServerApp(server_fn=lambda context: ServerAppComponents(
      strategy=strategy, config=ServerConfig(num_rounds=args.rounds + 1)))
  run_simulation(server_app=server, client_app=ClientApp(client_fn=client_fn),
                 num_supernodes=n,
                 # the actors inherit DATA_ENV: Ray starts them from this process's environment
                 backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
  peer.emit(peer.result("flower", {"flwr": version("flwr"), "ray": version("ray"),
                                   "torch": torch.__version__}, n, args.cohort, clock,
                        peak_rss_note="driver process only (Ray actors not counted)"))


if __name__ == "__main__":
  main()
