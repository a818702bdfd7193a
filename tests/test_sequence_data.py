"""Token sequences: TFF's Shakespeare and Stack Overflow files (tff_text.py), the
next_token task (losses.py) and the language models (models/lstm_lm.py), checked
against hand-tokenised examples, plain numpy loops and hand-counted parameters."""

import os

import jax
import numpy as np
import pytest

from fedjax_dp import losses
from fedjax_dp.data import tff_text
from fedjax_dp.data.natural import select_clients
from fedjax_dp.data.registry import load_dataset
from fedjax_dp.data.sample_files import write_sample
from fedjax_dp.errors import ConfigError, DataError
from fedjax_dp.models import make_model, num_params

from test_models import assert_paths_agree_and_dp_runs

P, B, E = tff_text.PAD, tff_text.BOS, tff_text.EOS


def _char(c: str) -> int:
  """TFF's id of a character: its place in the tutorial's 86 characters, after 3 specials."""
  return 3 + tff_text.SHAKESPEARE_CHARS.index(c.encode())


def test_shakespeare_joins_snippets_and_cuts_rows_as_fedjax_documents():
  """FedJAX's preprocess_client docstring: ['ABCD', 'E'] in rows of 3 gives
  x [[BOS A B] [C D EOS] [BOS E PAD]], y [[A B C] [D EOS BOS] [E EOS PAD]]."""
  a, b, c, d, e = (_char(ch) for ch in "ABCDE")
  x, y = tff_text.shakespeare_sequences([b"ABCD", b"E"], length=3)
  np.testing.assert_array_equal(x, [[B, a, b], [c, d, E], [B, e, P]])
  np.testing.assert_array_equal(y, [[a, b, c], [d, E, B], [e, E, P]])
  assert tff_text.SHAKESPEARE_VOCAB == 90 and len(set(tff_text.SHAKESPEARE_CHARS)) == 86
  x, _ = tff_text.shakespeare_sequences(["a~\n"], length=8)   # str too; '~' is out of vocabulary
  np.testing.assert_array_equal(x[0], [B, _char("a"), 89, _char("\n"), P, P, P, P])


def test_stackoverflow_tokenises_pads_and_truncates_as_fedjax_does():
  vocab = {b"how": 3, b"to": 4}
  x, y = tff_text.stackoverflow_sequences([b"how to jax", b"", b" ".join([b"to"] * 25)], vocab)
  oov = tff_text.SO_OOV
  assert x.shape == y.shape == (3, 20) and oov == 10_003
  np.testing.assert_array_equal(x[0, :5], [B, 3, 4, oov, P])
  np.testing.assert_array_equal(y[0, :5], [3, 4, oov, E, P])
  # an empty post is one empty word (TF's split with sep=' ', as FedJAX tokenises)
  np.testing.assert_array_equal(x[1, :3], [B, oov, P])
  np.testing.assert_array_equal(y[1, :3], [oov, E, P])
  np.testing.assert_array_equal(x[2], [B] + [4] * 19)      # 27 ids cut to 20: no EOS
  np.testing.assert_array_equal(y[2], [4] * 20)
  x, _ = tff_text.stackoverflow_sequences([b"how  to ", b"how to"], vocab)
  np.testing.assert_array_equal(x[0, :6], [B, 3, oov, 4, oov, P])   # two spaces; a trailing one
  np.testing.assert_array_equal(x[1, :4], [B, 3, 4, P])


def test_the_vocabulary_is_the_word_counts_first_10000_words(tmp_path):
  folder = tmp_path / "so"
  write_sample("stackoverflow", str(folder), num_clients=3, examples_per_client=4)
  vocab = tff_text.read_vocabulary(str(folder))
  assert len(vocab) == 10_000 and vocab[b"w00000"] == 3 and vocab[b"w09999"] == 10_002
  assert b"w10000" not in vocab
  lines = (folder / tff_text.WORD_COUNTS).read_text().splitlines()
  (folder / tff_text.WORD_COUNTS).write_text("\n".join(lines[:500]) + "\n")
  with pytest.raises(DataError, match="holds 500 words; the benchmark's vocabulary is the first "
                                      "10000"):
    tff_text.read_vocabulary(str(folder))
  (folder / tff_text.WORD_COUNTS).write_text("the 12\nof 9\nthe 3\n")
  with pytest.raises(DataError, match="line 3 repeats the word b'the' \\(line 1\\)"):
    tff_text.read_vocabulary(str(folder))
  (folder / tff_text.WORD_COUNTS).write_text("the 12\nbroken\n")
  with pytest.raises(DataError, match="line 2 is b'broken"):
    tff_text.read_vocabulary(str(folder))
  os.remove(folder / tff_text.WORD_COUNTS)
  with pytest.raises(DataError, match="stackoverflow.word_count not found"):
    load_dataset("stackoverflow", str(folder))


@pytest.mark.parametrize("name", ["shakespeare_tff", "stackoverflow"])
def test_text_files_load_with_their_clients_and_tokens(tmp_path, name):
  folder = str(tmp_path / name)
  write_sample(name, folder, num_clients=6, examples_per_client=5)
  ds = load_dataset(name, folder)
  length, vocab = (80, 90) if name == "shakespeare_tff" else (20, 10_004)
  assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32
  assert ds.x_train.shape[1:] == ds.y_train.shape[1:] == (length,)
  assert ds.num_classes == vocab and len(ds.client_ids) == 6
  assert ds.test_source == "client_rows"   # the same roles / users' later examples
  # inputs shifted by one are the targets, wherever both are tokens
  both = (ds.x_train[:, 1:] != P) & (ds.y_train[:, :-1] != P)
  np.testing.assert_array_equal(ds.x_train[:, 1:][both], ds.y_train[:, :-1][both])
  assert ds.y_train.max() < vocab


@pytest.mark.parametrize("test_clients", [0, 2])
@pytest.mark.parametrize("name", ["shakespeare_tff", "stackoverflow"])
def test_reading_only_the_chosen_clients_equals_selecting_from_all(tmp_path, name, test_clients):
  """partition natural_id reads only the clients it takes: the same Dataset as
  reading every client and selecting (natural.select_clients)."""
  folder = str(tmp_path / name)
  write_sample(name, folder, num_clients=9, examples_per_client=4)
  every, _ = select_clients(load_dataset(name, folder), 5, test_clients, seed=3)
  chosen = load_dataset(name, folder, clients=(5, test_clients, 3))
  assert chosen.client_ids == every.client_ids and chosen.test_source == every.test_source
  for field in ("x_train", "y_train", "x_test", "y_test"):
    np.testing.assert_array_equal(getattr(chosen, field), getattr(every, field))
  for a, b in zip(chosen.client_parts, every.client_parts):
    np.testing.assert_array_equal(a, b)


def test_a_run_reads_the_chosen_clients_and_takes_the_datasets_task(tmp_path):
  from fedjax_dp import make_config
  from fedjax_dp.experiment.setup import load_data, run_task, setup
  folder = str(tmp_path / "so")
  write_sample("stackoverflow", folder, num_clients=8, examples_per_client=4)
  cfg = make_config(dict(dataset="stackoverflow", data_dir=folder, partition="natural_id",
                         num_clients=4, test_clients=2, clients_per_round=2,
                         model="word_lstm", rounds=1))
  ds = load_data(cfg)
  assert len(ds.client_ids) == 4 and ds.clients_taken.startswith("partition natural_id")
  assert run_task(cfg).builtin.startswith("next_token(pad=0, not_scored=(2,), "
                                         "never_predicted=(0, 1, 2, 10003)")
  _, parts, sim = setup(cfg, ds)   # the loaded clients are taken as they are
  assert len(parts) == 4 and sim.test_data[1].shape[-1] == 20
  # the Python API without a loss takes the dataset's task too (classification would refuse)
  import fedjax_dp
  sim = fedjax_dp.simulate({"model": "word_lstm"}, data=load_dataset("stackoverflow", folder),
                           partition="natural_id", num_clients=4, test_clients=2,
                           clients_per_round=2)
  assert sim.test_data[1].shape[-1] == 20   # built: check_model refuses classification
  for bad, message in ((dict(model="mlp"), "outputs of shape \\(10004,\\) per example, expected "
                        "\\(20, 10004\\)"),
                       (dict(partition="dirichlet", test_clients=0),
                        "partition 'dirichlet' splits by class")):
    with pytest.raises((ConfigError, DataError), match=message):
      setup(make_config(dict(cfg.to_dict(), **bad)))


def _numpy_next_token(logits, targets, mask, never, not_scored):
  """The per-token loss and accuracy by a plain loop over tokens."""
  loss_sum = loss_n = hit = scored = 0.0
  for i in range(targets.shape[0]):
    for t in range(targets.shape[1]):
      z, k = logits[i, t].astype(np.float64), targets[i, t]
      if not mask[i] or k == P:
        continue
      loss_sum += np.log(np.sum(np.exp(z - z.max()))) + z.max() - z[k]
      loss_n += 1
      if k in not_scored:
        continue
      z = z.copy()
      z[list(never)] = -np.inf
      hit += float(np.argmax(z) == k)
      scored += 1
  return loss_sum / loss_n, hit / scored


def test_next_token_loss_and_metrics_against_a_plain_loop():
  from fedjax_dp.core.evaluate import batch_for_eval, make_evaluate
  from fedjax_dp.models.model import Model
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(7, 5, 9)).astype(np.float32) * 2
  targets = rng.integers(0, 9, (7, 5)).astype(np.int32)
  targets[:, 3:] = np.where(rng.random((7, 2)) < 0.5, P, targets[:, 3:])   # padding
  mask = np.array([1, 1, 0, 1, 1, 1, 0], bool)
  never, not_scored = (0, 1, 2, 8), (2,)
  task = losses.next_token(pad=P, not_scored=not_scored, never_predicted=never)
  want_loss, _ = _numpy_next_token(logits, targets, mask, never, not_scored)
  np.testing.assert_allclose(float(task.loss(logits, targets, mask)), want_loss, rtol=1e-5)
  # evaluation: per-token means over the whole test set, across batches of 3
  every = np.ones(7, bool)
  loss, acc = _numpy_next_token(logits, targets, every, never, not_scored)
  table = Model(init=lambda key: {},
                apply=lambda p, i: jax.numpy.asarray(logits)[i[:, 0].astype(int)], name="t")
  index = np.arange(7, dtype=np.float32)[:, None]
  values = make_evaluate(table, task)({}, *batch_for_eval(index, targets, 3, "int32"))
  np.testing.assert_allclose(values["loss"], loss, rtol=1e-5)
  np.testing.assert_allclose(values["accuracy"], acc, rtol=1e-6)
  assert task.sequence and losses.CLASSIFICATION.sequence is False
  with pytest.raises(ConfigError, match="never_predicted = \\(-1,\\)"):
    losses.next_token(never_predicted=(-1,))


def test_the_language_models_parameters_by_hand():
  """char_lstm_seq: embed 8, two LSTMs of 256, dense to 90 (TFF / FedJAX Shakespeare);
  word_lstm: embed 96, LSTM 670, dense 96, dense to 10,004: 4,050,748, the count
  Reddi et al. (2021) give for their Stack Overflow model."""
  lstm = lambda n_in, units: 4 * (n_in * units + units * units + units)
  seq = make_model("char_lstm_seq", (80,), 90)
  params = jax.eval_shape(seq.init, jax.random.PRNGKey(0))
  assert num_params(params) == (
      90 * 8 + lstm(8, 256) + lstm(256, 256) + 256 * 90 + 90) == 820_522
  word = make_model("word_lstm", (20,), 10_004)
  assert num_params(jax.eval_shape(word.init, jax.random.PRNGKey(0))) == (
      10_004 * 96 + lstm(96, 670) + 670 * 96 + 96 + 96 * 10_004 + 10_004) == 4_050_748
  out = jax.eval_shape(seq.apply, params, jax.ShapeDtypeStruct((2, 80), np.float32))
  assert out.shape == (2, 80, 90)


def _token_rows(rng, rows: int, length: int, vocab: int):
  x = rng.integers(3, vocab, (rows, length)).astype(np.float32)
  y = np.roll(x, -1, axis=1).astype(np.int32)
  y[:, -1] = P
  return x, y


@pytest.mark.slow   # 40 s and 2 minutes
@pytest.mark.parametrize("name", ["char_lstm_seq", "word_lstm"])
def test_language_models_through_the_round(name):
  """map, vmap and 2 devices agree; central DP's clipped round runs (next_token)."""
  x, y = _token_rows(np.random.default_rng(0), 24, 6, 11)
  task = losses.next_token(never_predicted=(0, 1, 2))
  assert_paths_agree_and_dp_runs(x, y, 11, model=name, lr=0.5, task=task)


def test_your_own_sequence_model_from_flax_learns_a_known_successor(tmp_path):
  """A flax bigram model of your own (token ids in, logits per position out) on
  your own token data with padding, through fedjax_dp.run with loss next_token:
  each token's successor is fixed (t -> t + 1 mod 12, ids 3..14), so the per-token
  accuracy reaches 1 and the padding is never scored."""
  import flax.linen as nn
  import fedjax_dp
  from fedjax_dp.data import from_clients
  from fedjax_dp.models import from_flax

  class Bigram(nn.Module):
    vocab: int

    @nn.compact
    def __call__(self, x):
      return nn.Embed(self.vocab, self.vocab)(x.astype(jax.numpy.int32))   # [B, T, vocab]

  rng = np.random.default_rng(0)
  successor = lambda t: 3 + (t - 3 + 1) % 12

  def rows(n):
    x = rng.integers(3, 15, (n, 1))
    for _ in range(7):
      x = np.concatenate([x, successor(x[:, -1:])], 1)
    y = successor(x)
    cut = rng.integers(3, 9, n)             # each row's length; the rest is padding
    pad = np.arange(8) >= cut[:, None]
    return np.where(pad, P, x).astype(np.float32), np.where(pad, P, y).astype(np.int32)
  data = from_clients([rows(12) for _ in range(6)], test=rows(40))
  task = losses.next_token(pad=P, never_predicted=(P,))
  summary = fedjax_dp.run({"algorithm": "fedavg"}, out=str(tmp_path / "run"),
                          model=from_flax(Bigram(15), data.x_train[:1]), data=data, loss=task,
                          rounds=15, clients_per_round=6, lr=1.0, batch_size=4, local_epochs=2,
                          eval_every=15, progress=False)
  assert summary["final"]["test_accuracy"] == 1.0
  assert summary["final"]["test_loss"] < 0.5


@pytest.mark.slow   # about 2 minutes
def test_the_sequence_lstm_learns_a_chain_to_near_its_floor(tmp_path):
  """char_lstm_seq, federated on rows of a Markov chain over 20 of 40 token ids
  with a known entropy rate (sample_files.markov_chain: 0.95 nats; a uniform guess
  over the 40 ids is 3.69): every target is a transition, so the floor of the
  per-token test loss is the rate. 30 rounds reach 1.064 (every 5: 1.92, 1.36, 1.19,
  1.11, 1.08, 1.06)."""
  import fedjax_dp
  from fedjax_dp.data import from_clients
  from fedjax_dp.data.sample_files import markov_chain
  _, p, rate = markov_chain(0)
  rng = np.random.default_rng(1)

  def walk(rows, length=21):
    out = np.zeros((rows, length), np.int64)
    out[:, 0] = rng.integers(0, 20, rows)
    for t in range(1, length):
      out[:, t] = [rng.choice(20, p=p[s]) for s in out[:, t - 1]]
    return (out[:, :-1] + 20).astype(np.float32), (out[:, 1:] + 20).astype(np.int32)
  data = from_clients([walk(60) for _ in range(12)], test=walk(200))
  summary = fedjax_dp.run({"algorithm": "fedavg", "model": "char_lstm_seq"},
                          out=str(tmp_path / "run"), data=data, loss=losses.next_token(),
                          rounds=30, clients_per_round=6, lr=1.0, batch_size=10, local_epochs=1,
                          eval_every=30, progress=False)
  loss = summary["final"]["test_loss"]
  assert rate - 0.05 < loss < rate + 0.3, (loss, rate)


def test_a_next_token_setting_is_its_own_identity_and_a_copy_is_not_builtin():
  """The audit's findings: a resume with another next_token setting was taken as the
  same inputs, and a Task._replace'd copy kept the built-in identity (one run key
  for two losses)."""
  from fedjax_dp.experiment.inputs_fingerprint import own_inputs
  from fedjax_dp.recipes.release_identity import loss_identity
  so = tff_text.task("stackoverflow")
  plain = losses.next_token()
  assert so is tff_text.task("stackoverflow") and losses.is_builtin(so)
  copy = plain._replace(loss=losses.CLASSIFICATION.loss)
  assert not losses.is_builtin(copy) and loss_identity(copy) != loss_identity(plain)
  assert own_inputs(None, None, so, so) is None           # the dataset's own task
  other = own_inputs(None, None, plain, so)               # another setting: recorded
  assert other["loss"]["builtin"] == plain.builtin
  narrower = own_inputs(None, None, losses.next_token(not_scored=(2,)), so)
  assert narrower["loss"] != other["loss"]                # metrics' settings differ: inputs too


def test_token_settings_and_shapes_are_checked_in_one_line(tmp_path):
  from fedjax_dp import make_config
  from fedjax_dp.data import from_clients
  from fedjax_dp.data.registry import find_dataset
  from fedjax_dp.experiment.setup import setup
  for bad, message in ((dict(not_scored=2), "not_scored = 2: allowed are a tuple"),
                       (dict(pad=-1), "pad = -1: allowed is a token id"),
                       (dict(never_predicted=(True,)), "never_predicted = \\(True,\\)")):
    with pytest.raises(ConfigError, match=message):
      losses.next_token(**bad)
  rng = np.random.default_rng(0)
  x, y = _token_rows(rng, 12, 6, 11)
  data = from_clients([(x[:6], y[:6]), (x[6:], y[6:])], test=_token_rows(rng, 4, 6, 11))
  cfg = make_config(dict(dataset="custom", model="char_lstm_seq", num_clients=2,
                         clients_per_round=2))
  with pytest.raises(ConfigError, match="names token id 99, and the model has 11 outputs"):
    setup(cfg, data, task=losses.next_token(never_predicted=(99,)))
  with pytest.raises(ConfigError, match="are token ids, which the loss does not score: pass "
                                        "loss=fedjax_dp.losses.next_token"):
    setup(make_config(dict(cfg.to_dict(), model="mlp")), data)
  with pytest.raises(DataError, match="a column \\[N, 1\\]: pass y.ravel\\(\\)"):
    from_clients([(x[:6], y[:6, :1]), (x[6:], y[6:, :1])])
  folder = tmp_path / "so"
  write_sample("stackoverflow", str(folder), num_clients=3, examples_per_client=3)
  os.remove(folder / tff_text.WORD_COUNTS)
  ok, where = find_dataset("stackoverflow", str(folder))
  assert not ok and "lacks stackoverflow.word_count" in where


def test_an_empty_test_set_is_refused_and_a_lazy_read_needs_no_test_rows(tmp_path):
  """A test split holding none of the clients taken: reading it lazily works (held-out
  clients are the test set), and a run with no test example refuses in one line (it
  published accuracy 0 and loss 0)."""
  import h5py
  from fedjax_dp import make_config
  from fedjax_dp.experiment.setup import setup
  folder = tmp_path / "sh"
  write_sample("shakespeare_tff", str(folder), num_clients=4, examples_per_client=4)
  with h5py.File(folder / "shakespeare_test.h5", "a") as f:   # the test split: another role
    f["examples"].move(sorted(f["examples"])[0], "ANOTHER_ROLE")
    for cid in [c for c in f["examples"] if c != "ANOTHER_ROLE"]:
      del f["examples"][cid]
  base = dict(dataset="shakespeare_tff", data_dir=str(folder), partition="natural_id",
              model="char_lstm_seq", clients_per_round=2)
  ds = load_dataset("shakespeare_tff", str(folder), clients=(2, 1, 3))
  every, _ = select_clients(load_dataset("shakespeare_tff", str(folder)), 2, 1, seed=3)
  np.testing.assert_array_equal(ds.x_test, every.x_test)
  assert len(ds.x_test) == len(every.x_test) > 0
  cfg = make_config(dict(base, num_clients=3, test_clients=0))
  with pytest.raises(DataError, match="the test set is empty \\(its test split holds no "
                                      "example of the clients taken\\); hold clients out"):
    setup(cfg)
