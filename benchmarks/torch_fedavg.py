"""The reference the core benchmark is measured against: FedAvg as a PyTorch per-client loop.

Written the way FL papers' reference code is: a Python loop over clients;
each client copies the global model and runs E epochs of minibatch SGD
(torch.optim.SGD with momentum) over a fresh shuffle of its examples, the
last short batch kept; the server averages the client models weighted by
example count.

  python benchmarks/torch_fedavg.py   # a small self-demo on random data
"""

from __future__ import annotations

import json
import statistics
import time

import numpy as np
import torch
from torch import nn


def make_mlp(d: int, hidden, num_classes: int) -> nn.Module:
  layers, width = [], d
  for h in hidden:
    layers += [nn.Linear(width, h), nn.ReLU()]
    width = h
  layers.append(nn.Linear(width, num_classes))
  return nn.Sequential(*layers)


def fedavg_round(model: nn.Module, x: torch.Tensor, y: torch.Tensor, clients, *, local_epochs,
                 batch_size, lr, momentum, generator, permutations=None) -> None:
  """One FedAvg round in place on `model`; `permutations[c][e]` overrides client c's epoch order."""
  global_state = {k: v.clone() for k, v in model.state_dict().items()}
  total = sum(len(c) for c in clients)
  avg = {k: torch.zeros_like(v) for k, v in global_state.items()}
  loss_fn = nn.CrossEntropyLoss()
  for ci, idx in enumerate(clients):
    model.load_state_dict(global_state)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    for e in range(local_epochs):
      order = (permutations[ci][e] if permutations is not None
               else torch.randperm(len(idx), generator=generator))
      for start in range(0, len(idx), batch_size):
        batch = idx[order[start:start + batch_size]]
        opt.zero_grad()
        loss_fn(model(x[batch]), y[batch]).backward()
        opt.step()
    with torch.no_grad():
      for k, v in model.state_dict().items():
        avg[k] += v * (len(idx) / total)
  model.load_state_dict(avg)


def torch_fedavg_round_times(x_train: np.ndarray, y_train: np.ndarray, client_indices,
                             hidden=(200, 200), num_classes=10, local_epochs=1, batch_size=64,
                             lr=0.01, momentum=0.5, rounds=6, seed=0, threads: int | None = None,
                             init_state_dict=None, permutations=None) -> dict:
  """Times `rounds` FedAvg rounds with every client participating; returns timings (and the model)."""
  if threads:
    torch.set_num_threads(threads)
  torch.manual_seed(seed)
  generator = torch.Generator().manual_seed(seed)
  x = torch.from_numpy(np.ascontiguousarray(x_train.reshape(len(x_train), -1), np.float32))
  y = torch.from_numpy(np.asarray(y_train, np.int64))
  clients = [torch.from_numpy(np.asarray(c, np.int64)) for c in client_indices]
  model = make_mlp(x.shape[1], hidden, num_classes)
  if init_state_dict is not None:
    model.load_state_dict(init_state_dict)
  times = []
  for _ in range(rounds):
    t = time.perf_counter()
    fedavg_round(model, x, y, clients, local_epochs=local_epochs, batch_size=batch_size, lr=lr,
                 momentum=momentum, generator=generator, permutations=permutations)
    times.append(time.perf_counter() - t)
  return {"round_seconds": [round(t, 4) for t in times],
          "median_round_s": statistics.median(times[1:] if len(times) > 1 else times),
          "torch_threads": torch.get_num_threads(), "torch_version": torch.__version__,
          "examples_per_round": int(sum(len(c) for c in clients)) * local_epochs,
          "params": int(sum(p.numel() for p in model.parameters())), "model": model}


if __name__ == "__main__":
  rng = np.random.default_rng(0)
  x = rng.random((6000, 784), dtype=np.float32)
  y = rng.integers(0, 10, 6000)
  parts = np.array_split(rng.permutation(6000), 20)
  out = torch_fedavg_round_times(x, y, parts, rounds=3)
  out.pop("model")
  print(json.dumps(out, indent=2))
