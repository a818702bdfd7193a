"""The per-run plots readable when they matter (issue 41, item 5, the first-hour
review's finding 9): a diverging loss on a log scale, whole rounds on the axis, the
title saying what ran, epsilon.png saying whose epsilon a local-DP run's is."""

import pytest

from fedjax_dp.experiment import reporting


@pytest.fixture
def figures(monkeypatch):
  """The figures plot_metrics draws, by file name, instead of saving them."""
  seen = {}

  def keep(fig, path, **kwargs):
    seen[path.rsplit("/", 1)[-1]] = fig
  monkeypatch.setattr(reporting, "save_figure_atomic", keep)
  import matplotlib.pyplot as plt
  monkeypatch.setattr(plt, "close", lambda fig=None: None)
  return seen


def rows(losses, epsilon=None):
  return [{"round": 5 * (i + 1), "test_accuracy": 0.5, "test_loss": loss, "train_loss": loss,
           "bytes_up": 1e6 * i, "bytes_down": 1e6 * i, "epsilon": epsilon, "delta": 1e-5,
           "epsilon_accountant": "rdp"} for i, loss in enumerate(losses)]


def test_a_loss_spanning_decades_is_drawn_on_a_log_scale(figures, tmp_path):
  reporting.plot_metrics(rows([2.3, 1e8, 1e33]), str(tmp_path), title="t")
  assert figures["loss.png"].axes[0].get_yscale() == "log"
  assert figures["accuracy.png"].axes[0].get_yscale() == "linear"


def test_a_loss_within_two_decades_stays_linear(figures, tmp_path):
  reporting.plot_metrics(rows([2.3, 1.1, 0.4]), str(tmp_path), title="t")
  assert figures["loss.png"].axes[0].get_yscale() == "linear"


def test_round_ticks_are_whole_and_the_title_is_the_given_one(figures, tmp_path):
  one = rows([0.5], epsilon=3.0)   # a single evaluation: matplotlib ticked 4.8, 4.9, ...
  reporting.plot_metrics(one, str(tmp_path), title="mine: fedavg on digits")
  for fig in figures.values():
    ax = fig.axes[0]
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    assert ax.get_title() == "mine: fedavg on digits"


def test_local_dp_epsilon_says_whose_it_is(figures, tmp_path):
  reporting.plot_metrics(rows([0.5, 0.4], epsilon=3.0), str(tmp_path),
                         epsilon_is="the largest client's")
  assert figures["epsilon.png"].axes[0].get_ylabel().startswith(
      "epsilon spent by the largest client (rdp")
