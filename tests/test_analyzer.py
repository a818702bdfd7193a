"""The analyzer's semantic branch, fusion and per-client run; the partition it is run on."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.privacy.tiers import analyzer, semantic, semantic_cache, sensitivity
from fedjax_dp.data.partition import partition
from fedjax_dp.data.tabular import HIGH, LOW, MEDIUM, PUBLIC


def test_masked_statistics_equal_the_unpadded_ones():
  rng = np.random.default_rng(0)
  x = np.concatenate([rng.integers(0, 3, (37, 2)), rng.normal(size=(37, 3))], 1).astype(np.float32)
  s = x[:, [0, 3]] + rng.normal(size=(37, 2)).astype(np.float32)
  ref = rng.normal(size=(200, 5)).astype(np.float32)
  pad = np.concatenate([x, 99 * np.ones((11, 5), np.float32)])
  spad = np.concatenate([s, -7 * np.ones((11, 2), np.float32)])
  mask = np.arange(48) < 37
  scores = jax.jit(sensitivity.statistical_scores)    # as the analyzer runs it; eager takes seconds
  a = scores(jnp.asarray(x), jnp.asarray(s), jnp.asarray(ref))
  b = scores(jnp.asarray(pad), jnp.asarray(spad), jnp.asarray(ref), mask=jnp.asarray(mask))
  for k in a:
    np.testing.assert_allclose(np.asarray(b[k], np.float64), np.asarray(a[k], np.float64),
                               rtol=2e-5, atol=2e-5, err_msg=k)


def test_distillation_loss_by_hand():
  s = jnp.array([[1.0, 0.0, -1.0]])
  t = jnp.array([[0.0, 2.0, 0.0]])
  y = jnp.array([0])
  ce = -math.log(math.exp(1) / (math.exp(1) + 1 + math.exp(-1)))
  pt = np.exp(np.array([0.0, 2.0, 0.0]) / 3); pt /= pt.sum()
  ps = np.exp(np.array([1.0, 0.0, -1.0]) / 3); ps /= ps.sum()
  kl = float(np.sum(pt * np.log(pt / ps)))
  got = float(semantic.distillation_loss(s, t, y, temperature=3.0, alpha=0.3))
  assert got == pytest.approx(0.3 * ce + 0.7 * 9 * kl, rel=1e-5)
  # alpha 1 is plain cross-entropy; a student equal to its teacher pays no KL
  assert float(semantic.distillation_loss(s, t, y, alpha=1.0)) == pytest.approx(ce, rel=1e-5)
  assert float(semantic.distillation_loss(t, t, jnp.array([1]), alpha=0.0)) == pytest.approx(
      0.0, abs=1e-6)


def test_pruning_keeps_the_largest_thirty_percent():
  w = jax.random.normal(jax.random.PRNGKey(0), (16, 128))
  m = np.asarray(semantic.magnitude_mask(w, 0.7))
  assert m.sum() == round(0.3 * w.size)
  a = np.abs(np.asarray(w))
  assert a[m].min() > a[~m].max()


def test_int8_quantization_error_is_at_most_half_a_step():
  params = semantic.init_mlp(jax.random.PRNGKey(1), (16, 128, 64, 3))
  q = semantic.quantize_int8(params)
  for (w, _), qw, s in zip(params, q.weights, q.scales):
    assert qw.dtype == jnp.int8 and int(jnp.max(jnp.abs(qw.astype(jnp.int32)))) == 127
    err = np.abs(np.asarray(qw, np.float32) * np.asarray(s) - np.asarray(w))
    assert np.all(err <= np.asarray(s) / 2 + 1e-7)
  x = jax.random.normal(jax.random.PRNGKey(2), (50, 16))
  np.testing.assert_allclose(np.asarray(semantic.quantized_logits(q, x)),
                             np.asarray(semantic.mlp_logits(params, x)), atol=0.05 * 4)
  # int8 weights are a quarter of float32 (biases and scales stay float32)
  assert semantic.param_bytes(q.weights) * 4 == semantic.param_bytes([w for w, _ in params])


def test_thresholds_are_the_papers():
  got = analyzer.thresholds(np.array([0.0, 0.3, 0.3001, 0.7, 0.7001, 1.0]))
  np.testing.assert_array_equal(got, [LOW, LOW, MEDIUM, MEDIUM, HIGH, HIGH])


@pytest.fixture(scope="module")
def analysis():
  from fedjax_dp.data.tabular import healthcare_data
  x, y, tiers, _, sensitive = healthcare_data(1200, seed=3)
  x = (x - x.mean(0)) / (x.std(0) + 1e-9)
  parts = partition(y, 24, "dirichlet_client", alpha=0.5, seed=0)
  return analyzer.analyze_clients(x, parts, sensitive, tiers, semantic_steps=200), tiers


def test_analyzer_tiers_and_report(analysis):
  out, tiers = analysis
  rep = out["report"]
  # public and metadata features keep their tier from the metadata
  np.testing.assert_array_equal(out["tiers"][tiers >= PUBLIC], tiers[tiers >= PUBLIC])
  # the fused score is 0.6 stat + 0.4 sem per client, so also for the weighted means
  np.testing.assert_allclose(out["fused"], 0.6 * out["stat"] + 0.4 * out["sem"], atol=1e-5)
  np.testing.assert_array_equal(out["tiers"][tiers <= LOW],
                                analyzer.thresholds(out["fused"])[tiers <= LOW])
  acc = rep["tier_accuracy"]
  assert acc["features_scored"] == int(np.sum(tiers <= LOW))
  assert acc["run_tiers"] == acc["fused"]
  # the semantic branch recognises the generator's groups on a cohort it was not trained on
  assert acc["semantic_only"] > 0.85
  assert rep["memory_bytes"]["student_int8"] < rep["memory_bytes"]["student_float32"] / 3
  assert rep["seconds"]["per_client"] > 0


@pytest.mark.slow   # two runs with the analyzer: make test's 10 minutes
@pytest.mark.parametrize("generator", ["logits", "severity"])
def test_a_runs_default_rule_is_the_semantic_score_and_gets_nine_in_ten_tiers(tmp_path,
                                                                               generator):
  """Issue 23's bar for the analyzer: the default rule reaches >= 90 % of the
  known tiers on both healthcare generators; the paper's fusion, which its
  statistical half decides (README: Sensitivity analyzer), gets less, and on the
  severity cohort far less."""
  import fedjax_dp
  summary = fedjax_dp.run(
      {"dataset": "healthcare", "healthcare_examples": 1500, "healthcare_generator": generator,
       "num_clients": 20, "clients_per_round": 5, "rounds": 1, "eval_every": 1,
       "dp": "central", "noise_multiplier": 1.0, "clip_parts": "tiers",
       "tier_source": "analyzer"},
      out=str(tmp_path / generator), progress=False, log=lambda m: None)
  acc = summary["analyzer"]["tier_accuracy"]
  assert acc["run_tiers"] == acc["semantic_only"] >= 0.92     # 97.8 % and 93.5 %
  assert acc["fused"] < acc["semantic_only"]                  # 93.0 % and 56.5 %
  if generator == "severity":
    assert acc["fused"] < 0.9


def test_dirichlet_client_partition():
  y = np.repeat(np.arange(3), 400)
  for alpha in (0.01, 0.1, 1.0, 100.0):
    parts = partition(y, 120, "dirichlet_client", alpha=alpha, seed=1)
    every = np.sort(np.concatenate(parts))
    np.testing.assert_array_equal(every, np.arange(len(y)))
    assert {len(p) for p in parts} == {10}
  def top_share(alpha):
    parts = partition(y, 120, "dirichlet_client", alpha=alpha, seed=1)
    return np.mean([np.bincount(y[p], minlength=3).max() / len(p) for p in parts])
  assert top_share(0.01) > 0.9 > top_share(1.0) > top_share(100.0)


def test_analyzer_needs_tabular_data():
  from fedjax_dp import make_config
  from fedjax_dp.errors import ConfigError
  from fedjax_dp.experiment.setup import setup
  with pytest.raises(ConfigError, match="tier_source"):
    setup(make_config({"dataset": "digits", "tier_source": "analyzer"}))


def _same_arrays(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(la) == len(lb)
  for x, y in zip(la, lb):
    assert np.asarray(x).dtype == np.asarray(y).dtype
    assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


@pytest.mark.slow   # make test's 10 minutes (CI runs it in make test-slow)
def test_the_trained_network_is_cached_on_disk_and_loads_bit_for_bit(tmp_path, monkeypatch):
  """A second process (the in-process memo cleared) loads what the first trained:
  the same bits as training again; a damaged file is trained again and replaced; a
  changed step count is another file; FEDJAX_DP_CACHE=off writes nothing."""
  monkeypatch.setenv("FEDJAX_DP_CACHE", str(tmp_path))
  steps = 30
  analyzer.semantic_model.cache_clear()
  first = analyzer.semantic_model(0, steps)
  assert first.source == "trained"
  files = list((tmp_path / "semantic").iterdir())
  assert [f.suffix for f in files] == [".npz"]
  analyzer.semantic_model.cache_clear()
  loaded = analyzer.semantic_model(0, steps)
  assert loaded.source == f"cache {files[0]}"
  fresh = analyzer.train_semantic_model(0, steps)
  for m in (first, loaded):
    _same_arrays((m.teacher, m.student, m.quantized), (fresh.teacher, fresh.student,
                                                        fresh.quantized))
    assert (m.train_accuracy, m.bytes, m.training_examples) == (
        fresh.train_accuracy, fresh.bytes, fresh.training_examples)

  data = bytearray(files[0].read_bytes())
  data[len(data) // 2] ^= 0xFF                      # one byte of the arrays flipped
  files[0].write_bytes(bytes(data))
  analyzer.semantic_model.cache_clear()
  assert analyzer.semantic_model(0, steps).source == "trained"
  analyzer.semantic_model.cache_clear()
  assert analyzer.semantic_model(0, steps).source.startswith("cache ")
  with np.load(files[0]) as z:                      # a well-formed file with other numbers
    arrays = {k: z[k] for k in z.files}
  arrays["int8_b0"] = arrays["int8_b0"] + np.float32(1.0)
  np.savez(files[0], **arrays)
  assert semantic_cache.load(str(files[0])) is None  # its recorded SHA-256 no longer holds
  analyzer.semantic_model.cache_clear()
  assert analyzer.semantic_model(0, steps).source == "trained"

  # another step count or seed is another file (a seed trains with the same program)
  assert semantic_cache.model_key(0, steps + 1) != semantic_cache.model_key(0, steps)
  analyzer.semantic_model.cache_clear()
  analyzer.semantic_model(1, steps)
  assert len(list((tmp_path / "semantic").glob("*.npz"))) == 2
  assert not list((tmp_path / "semantic").glob("*.tmp"))

  off = tmp_path / "off"
  monkeypatch.setenv("FEDJAX_DP_CACHE", "off")
  monkeypatch.setenv("XDG_CACHE_HOME", str(off))
  analyzer.semantic_model.cache_clear()
  assert analyzer.semantic_model(0, steps).source == "trained"
  assert not off.exists()
  analyzer.semantic_model.cache_clear()
