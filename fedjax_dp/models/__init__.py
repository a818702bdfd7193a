"""Flax models: an MLP of any depth, the CNN of the FedAvg and LEAF papers,
ResNet-18 with group normalisation, the Shakespeare character LSTM, and yours.

  model.py     Model (an (init, apply) pair over a params pytree), from_flax, num_params
  registry.py  MODELS by name (the config's `model`), make_model
  mlp.py, cnn.py, resnet.py, char_lstm.py  the built-in modules
"""

from fedjax_dp.models.char_lstm import CharLSTM
from fedjax_dp.models.cnn import CNN
from fedjax_dp.models.mlp import MLP
from fedjax_dp.models.model import Model, from_flax, num_params
from fedjax_dp.models.registry import MODELS, ModelSource, as_model, make_model
from fedjax_dp.models.resnet import ResNet18

__all__ = ["CNN", "CharLSTM", "MLP", "MODELS", "Model", "ModelSource", "ResNet18", "as_model", "from_flax",
           "make_model", "num_params"]
