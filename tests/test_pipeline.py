"""Update pipeline: top-k with error feedback, index selection, noise on kept
coordinates, the layer-wise shuffler, downlink top-k, bytes, and the round."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fedjax_dp.compression import pipeline as pl
from fedjax_dp.privacy.mechanisms import kept_noise
from fedjax_dp import make_config
from fedjax_dp.errors import ConfigError
from fedjax_dp.experiment.runner import communication
from fedjax_dp.kernels import topk as topk_kernels
from tests.helpers import flat, keyed_state, round_zero_deltas, toy_problem, toy_simulation

D = 1000


def ctx(key=0, n=50, lr=0.01, public=None):
  return pl.StageContext(jax.random.PRNGKey(key), jnp.int32(n), jnp.float32(lr),
                         jnp.zeros(D) if public is None else public)


def upload(v):
  return pl.Upload(jnp.asarray(v, jnp.float32), jnp.ones(len(v), bool))


def test_topk_kernels():
  x = jnp.asarray(np.random.default_rng(0).normal(size=D), jnp.float32)
  want = np.zeros(D, bool)
  want[np.argsort(-np.abs(np.asarray(x)))[:37]] = True
  np.testing.assert_array_equal(topk_kernels.topk_mask_exact(x, 37), want)
  approx = topk_kernels.topk_mask_approx(x, 37)
  assert int(approx.sum()) == 37 and np.mean(np.asarray(approx)[want]) >= 0.9
  thr = topk_kernels.topk_mask_threshold(x, 37, jax.random.PRNGKey(1))
  assert int(thr.sum()) == 37
  r = topk_kernels.random_k_mask(jax.random.PRNGKey(2), D, 37)
  assert int(r.sum()) == 37


@pytest.mark.parametrize("selection", ["topk", "random_k", "public_topk"])
def test_error_feedback_conserves_mass(selection):
  rng = np.random.default_rng(1)
  stage = pl.topk_with_error_feedback(0.9, selection)
  residual = jnp.asarray(rng.normal(size=D), jnp.float32)
  u = rng.normal(size=D)
  public = jnp.asarray(rng.normal(size=D), jnp.float32)
  out, new_residual, _ = stage.update(upload(u), residual, ctx(public=public))
  # sent + new residual = update + old residual, exactly
  np.testing.assert_array_equal(np.asarray(out.values) + np.asarray(new_residual),
                                np.asarray(jnp.asarray(u, jnp.float32) + residual))
  assert int(out.sent.sum()) == 100 and np.all(np.asarray(out.values)[~np.asarray(out.sent)] == 0)
  v = np.asarray(jnp.asarray(u, jnp.float32) + residual)
  if selection == "topk":
    assert np.min(np.abs(v[np.asarray(out.sent)])) >= np.max(np.abs(v[~np.asarray(out.sent)]))
  if selection == "public_topk":   # indices from the public update, not from the private one
    np.testing.assert_array_equal(out.sent, topk_kernels.topk_mask_exact(public, 100))
  if selection == "random_k":      # indices from the key alone
    other, _, _ = stage.update(upload(-u * 7), residual, ctx())
    np.testing.assert_array_equal(out.sent, other.sent)


def test_sparsity_zero_without_noise_is_the_identity():
  u = np.random.default_rng(2).normal(size=D)
  stage = pl.chain(pl.clip_per_coordinate(1e9), pl.topk_with_error_feedback(0.0),
                   pl.clip_l2(1e12))
  out, state, _ = stage.update(upload(u), stage.init(D), ctx())
  np.testing.assert_array_equal(np.asarray(out.values), np.asarray(u, np.float32))
  np.testing.assert_array_equal(np.asarray(state[1]), 0.0)


def test_noise_only_on_kept_coordinates_with_the_papers_std():
  k = 100
  settings = {"ldp_epsilon": 3.0, "ldp_delta": 1e-5}
  want = (2 * 0.01 * 0.05 / 50) * np.sqrt(2 * np.log(1.25 / 1e-5)) / (3.0 / k)
  assert kept_noise.report_std(kept_noise.paper(), settings, 0.05, k, 0.01, 50) == \
      pytest.approx(want, rel=1e-12)
  # the round draws the std the report quotes (k = 100 of D = 1000 kept)
  stage = kept_noise.client_stage(kept_noise.paper(), settings, 0.05, 1 - k / D, "aggregate")
  drawn = stage.update(upload(np.zeros(D)), stage.init(D), ctx())[0].noise_std
  assert float(drawn) == pytest.approx(want, rel=1e-6)
  stage = pl.chain(pl.topk_with_error_feedback(0.9), pl.gaussian_on_kept(lambda c: 2.0))
  u = np.zeros(D)
  u[:k] = 100.0
  out, _, _ = stage.update(upload(u), stage.init(D), ctx())
  noise = np.asarray(out.values)[:k] - 100.0
  assert np.all(np.asarray(out.values)[k:] == 0)
  assert stats.kstest(noise / 2.0, "norm").pvalue > 1e-3


def test_layerwise_shuffle_is_a_per_layer_permutation():
  rng = np.random.default_rng(3)
  uploads = {"w": jnp.asarray(rng.normal(size=(16, 5, 3))), "b": jnp.asarray(rng.normal(size=(16, 3)))}
  out = pl.layerwise_shuffle(uploads, jax.random.PRNGKey(0))
  for name in uploads:
    a, b = np.asarray(uploads[name]), np.asarray(out[name])
    # the same multiset of per-client tuples
    assert sorted(map(bytes, a.reshape(16, -1))) == sorted(map(bytes, b.reshape(16, -1)))
    np.testing.assert_allclose(b.mean(0), a.mean(0), rtol=1e-5, atol=1e-7)
    assert not np.array_equal(a, b)
  # layers are permuted independently: the link between a client's layers is broken
  perm_w = [np.flatnonzero((np.asarray(uploads["w"]) == r).all(axis=(1, 2)))[0]
            for r in np.asarray(out["w"])]
  perm_b = [np.flatnonzero((np.asarray(uploads["b"]) == r).all(axis=1))[0]
            for r in np.asarray(out["b"])]
  assert perm_w != perm_b


def test_downlink_topk_keeps_the_rest_on_the_server():
  rng = np.random.default_rng(4)
  v, r = jnp.asarray(rng.normal(size=D), jnp.float32), jnp.asarray(rng.normal(size=D), jnp.float32)
  sent, mask, new_r = pl.downlink_topk(v, r, 0.9)
  np.testing.assert_array_equal(np.asarray(sent) + np.asarray(new_r), np.asarray(v + r))
  assert int(mask.sum()) == 100


def test_bytes_against_a_hand_count():
  # 199,210 parameters (MLP 784-200-200-10). A d-bit bitmap is 24,902 bytes; it
  # beats 32-bit indices once k > d / 32.
  # s = 0.99: k = 1,992 values + 1,992 indices = 15,936 bytes (bitmap: 32,870)
  assert pl.sparse_bytes(199210, 1992) == (15936, "float32 values + int32 indices")
  # s = 0.9: k = 19,921 values + the bitmap = 104,586 bytes (indices: 159,368)
  assert pl.sparse_bytes(199210, 19921) == (104586, "float32 values + d-bit bitmap")
  assert pl.sparse_bytes(199210, 199210) == (796840, "dense float32")
  c = communication(make_config({"algorithm": "topksdp"}), 199210)
  assert c["k_up"] == c["k_down"] == 19921
  assert c["bytes_per_client_up"] == c["bytes_per_client_down"] == 104586
  # SCAFFOLD adds its dense control variates both ways; SOLO sends nothing
  c = communication(make_config({"algorithm": "scaffold"}), 199210)
  assert c["bytes_per_client_up"] == c["bytes_per_client_down"] == 2 * 796840
  c = communication(make_config({"algorithm": "scaffold", "s_local": 0.9}), 199210)
  assert c["bytes_per_client_up"] == 104586 + 796840
  assert c["bytes_per_client_down"] == 2 * 796840
  c = communication(make_config({"algorithm": "solo"}), 199210)
  assert c["bytes_per_client_up"] == c["bytes_per_client_down"] == 0
  c = communication(make_config({"algorithm": "fedprox+moon"}), 199210)
  assert c["bytes_per_client_up"] == c["bytes_per_client_down"] == 796840


@pytest.mark.parametrize("kernel", ["exact", "approx"])   # approx: an exact top-k on CPU
def test_round_with_topk_and_downlink_against_numpy(kernel):
  x, y, parts = toy_problem(sizes=(8, 9, 10, 11))
  sim = toy_simulation(x, y, parts, hidden=[6], s_local=0.8, s_global=0.5, topk_kernel=kernel)
  s0 = sim.init_state()
  deltas = [flat(d) for d in round_zero_deltas(sim, s0)]
  p0 = flat(s0.params)   # the round donates s0
  s1, _ = sim.run_rounds(s0, 1)
  d = deltas[0].size
  k = pl.keep_count(d, 0.8)
  sent, residuals = [], []
  for v in deltas:
    m = np.zeros(d, bool)
    m[np.argsort(-np.abs(v), kind="stable")[:k]] = True
    sent.append(np.where(m, v, 0.0))
    residuals.append(v - sent[-1])
  n = np.array([8, 9, 10, 11], float)
  agg = np.sum([w * s for w, s in zip(n / n.sum(), sent)], axis=0)
  kd = pl.keep_count(d, 0.5)
  md = np.zeros(d, bool)
  md[np.argsort(-np.abs(agg), kind="stable")[:kd]] = True
  np.testing.assert_allclose(flat(s1.params) - p0, np.where(md, agg, 0.0),
                             atol=1e-6)
  np.testing.assert_allclose(np.asarray(s1.server_state["downlink_residual"]),
                             np.where(md, 0.0, agg), atol=1e-6)
  got_res = np.asarray(s1.client_state["pipeline"][0])
  np.testing.assert_allclose(got_res, np.stack(residuals), atol=1e-6)


def test_shuffled_round_weights_uniformly():
  x, y, parts = toy_problem(sizes=(8, 9, 10, 11))
  sim = toy_simulation(x, y, parts, hidden=[6], shuffle="layerwise", devices=2)
  s0 = sim.init_state()
  deltas = [flat(d) for d in round_zero_deltas(sim, s0)]
  p0 = flat(s0.params)
  s1, _ = sim.run_rounds(s0, 1)
  np.testing.assert_allclose(flat(s1.params) - p0, np.mean(deltas, axis=0),
                             atol=1e-6)


def test_preset_and_errors():
  cfg = make_config({"algorithm": "topksdp"})
  assert (cfg.s_local, cfg.s_global, cfg.shuffle) == (0.9, 0.9, "layerwise")
  assert make_config({"algorithm": "topksdp", "s_local": 0.5}).s_local == 0.5
  with pytest.raises(ConfigError, match="needs ldp_epsilon"):
    make_config({"algorithm": "topksdp", "kept_noise": "paper", "coordinate_clip": 0.1})
  with pytest.raises(ConfigError, match="needs final_clip_l2, coordinate_clip"):
    make_config({"algorithm": "topksdp", "kept_noise": "multiplier"})
  with pytest.raises(ConfigError, match="'s_local' = 1"):
    make_config({"s_local": 1})


def test_topksdp_run_counts_bytes(tmp_path):
  import json
  import os
  from fedjax_dp.cli import main
  out = str(tmp_path / "t")
  sets = ["dataset=digits", "num_clients=10", "clients_per_round=5", "hidden=[32]",
          "batch_size=16", "lr=0.05", "rounds=20", "eval_every=10", "devices=1",
          "algorithm=topksdp"]
  assert main(["run", "--no-progress", "--out", out] + sum([["--set", s] for s in sets], [])) == 0
  summary = json.load(open(os.path.join(out, "summary.json")))
  rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
  c = summary["communication"]
  d = summary["model"]["params"]            # 64*32 + 32 + 32*10 + 10 = 2,410
  assert d == 2410 and c["k_up"] == c["k_down"] == 241
  # 241 values (964 bytes) + a 2,410-bit bitmap (302 bytes) beats 241 indices (964 bytes)
  assert c["bytes_per_client_up"] == 964 + 302 and "bitmap" in c["encoding_up"]
  assert rows[-1]["bytes_up"] == 20 * 5 * c["bytes_per_client_up"]
  assert summary["final"]["test_accuracy"] > 0.5


def test_threshold_kernel_in_the_stage_keeps_exactly_k_and_conserves_mass():
  rng = np.random.default_rng(5)
  stage = pl.topk_with_error_feedback(0.9, kernel="threshold")
  u = rng.normal(size=D)
  out, residual, _ = stage.update(upload(u), stage.init(D), ctx())
  assert int(out.sent.sum()) == 100
  np.testing.assert_array_equal(np.asarray(out.values) + np.asarray(residual),
                                np.asarray(u, np.float32))
  exact = topk_kernels.topk_mask_exact(jnp.asarray(u, jnp.float32), 100)
  assert np.mean(np.asarray(out.sent)[np.asarray(exact)]) >= 0.9


@pytest.mark.parametrize("d,k", [(1000, 100), (5000, 37), (20000, 2000), (3000, 2999)])
def test_bisect_kernel_keeps_an_exact_top_c_with_c_at_most_k(d, k):
  rng = np.random.default_rng(d + k)
  x = jnp.asarray(rng.standard_t(2.0, size=d), jnp.float32)
  m = np.asarray(topk_kernels.topk_mask_bisect(x, k, jax.random.PRNGKey(0)))
  a = np.abs(np.asarray(x))
  c = int(m.sum())
  assert c <= k and c >= 0.99 * k
  assert a[m].min() >= a[~m].max()          # the largest c, nothing else
  # enough passes reach the exact top-k (distinct values)
  exact = np.asarray(topk_kernels.topk_mask_exact(x, k))
  full = np.asarray(jnp.abs(x) >= topk_kernels.kth_largest_threshold(jnp.abs(x), k,
                                                                     jax.random.PRNGKey(0),
                                                                     passes=60))
  np.testing.assert_array_equal(full, exact)


# 40 passes run the sample's bracket, the secant steps and the bisections to the end;
# 0, 3 and 6 stop at the pass limit after the bracket or part way (~8-17 s each):
# `make test-slow` (CI runs it); in `make test` the bisect kernel's tests run the
# threshold through topk_mask_bisect
@pytest.mark.slow
@pytest.mark.parametrize("passes", [0, 3, 6, 40])
def test_magnitude_threshold_equals_the_threshold_of_the_absolute_values(passes):
  """kth_largest_magnitude(x) never forms |x| but must give kth_largest_threshold(|x|)
  bit for bit: signed zeros, ties, infinities and a sample that misses included."""
  rng = np.random.default_rng(13)
  cases = [rng.normal(size=20_000), rng.standard_t(1.5, size=9_000),
           np.round(rng.normal(size=5_000), 1),                      # many ties
           np.concatenate([np.zeros(3_000), -np.zeros(3_000), rng.normal(size=300)])]
  hidden = np.linspace(0.0, 0.1, 1000)
  hidden[np.isin(np.arange(1000) % 62, np.arange(20, 31))] = -5.0   # the sample misses these
  cases.append(hidden)
  cases.append(np.concatenate([rng.normal(size=999), [np.inf, -np.inf]]))
  for i, x in enumerate(cases):
    x = jnp.asarray(x, jnp.float32)
    for k in (1, x.shape[0] // 10, x.shape[0] - 1):
      key = jax.random.PRNGKey(i)
      sample = 16 if i == 4 else 4096
      want = topk_kernels.kth_largest_threshold(jnp.abs(x), k, key, sample=sample, passes=passes)
      got = topk_kernels.kth_largest_magnitude(x, k, key, sample=sample, passes=passes)
      assert np.asarray(got).tobytes() == np.asarray(want).tobytes(), (i, k)
      np.testing.assert_array_equal(topk_kernels.magnitude_at_least(x, got),
                                    np.abs(np.asarray(x)) >= np.asarray(got))
      assert int(topk_kernels.count_magnitude_at_least(x, got)) == int(
          (np.abs(np.asarray(x)) >= np.asarray(got)).sum()) <= k


def test_count_at_least_matches_numpy_on_both_sides_of_float32_exactness():
  """Summed in float32 below 2^24 values, in int32 from there: exact either way."""
  rng = np.random.default_rng(11)
  for n in (199_210, 2 ** 24 + 3):
    a = rng.random(n, dtype=np.float32)
    for t in (0.0, 0.3, 0.9999, 1.0):
      got = topk_kernels.count_at_least(jnp.asarray(a), jnp.float32(t))
      assert got.dtype == jnp.int32 and int(got) == int((a >= np.float32(t)).sum())
  rows = rng.random((3, 1000), dtype=np.float32)
  ts = np.array([[0.1], [0.5], [0.99]], np.float32)
  np.testing.assert_array_equal(
      np.asarray(topk_kernels.count_at_least(jnp.asarray(rows), jnp.asarray(ts), axis=1)),
      (rows >= ts).sum(axis=1))


@pytest.mark.parametrize("steps", [0, 8, 20, 32])
def test_sample_rank_bracket_is_exact_with_enough_steps_and_conservative_before(steps):
  rng = np.random.default_rng(12)
  s = np.abs(rng.standard_t(3.0, size=4096)).astype(np.float32) * np.float32(1e-3)
  ranks = np.array([486.4, 332.8], np.float32)
  lo, hi = (float(v) for v in topk_kernels.sample_rank_bracket(jnp.asarray(s), jnp.asarray(ranks),
                                                               steps=steps))
  desc = np.sort(s)[::-1]
  r_lo, r_hi = int(np.ceil(ranks[0])), int(np.ceil(ranks[1]))
  assert (s >= np.float32(lo)).sum() >= ranks[0] and (s >= np.float32(hi)).sum() < ranks[1]
  if steps == 32:   # exactly the ranks[0]-th largest, and the float just above the ranks[1]-th
    assert lo == desc[r_lo - 1] and hi == np.nextafter(desc[r_hi - 1], np.float32(np.inf))
  if steps == 20:   # wider by at most (max - min) / 2^20 bit patterns: a few ulps here
    ulps = lambda x: np.float32(x).view(np.int32)
    assert ulps(desc[r_lo - 1]) - ulps(lo) <= (ulps(s.max()) - ulps(s.min())) >> 20
    assert ulps(hi) - ulps(desc[r_hi - 1]) - 1 <= (ulps(s.max()) - ulps(s.min())) >> 20


def test_bisect_kernel_recovers_when_the_sample_misses():
  # the large values sit where a 16-value systematic sample of 1,000 (stride 62,
  # start 0..8) never looks, so the sampled bracket is wrong and must be widened
  d, k = 1000, 100
  a = np.linspace(0.0, 0.1, d).astype(np.float32)
  hidden = np.flatnonzero(np.isin(np.arange(d) % 62, np.arange(20, 31)))
  a[hidden] = 1.0 + np.arange(hidden.size, dtype=np.float32)
  t = topk_kernels.kth_largest_threshold(jnp.asarray(a), k, jax.random.PRNGKey(3), sample=16,
                                         passes=60)
  want = np.zeros(d, bool)
  want[np.argsort(-a)[:k]] = True
  np.testing.assert_array_equal(a >= float(t), want)
  for passes in (0, 2, 6):   # never more than k, whatever the passes
    t = topk_kernels.kth_largest_threshold(jnp.asarray(a), k, jax.random.PRNGKey(3), sample=16,
                                           passes=passes)
    assert int((a >= float(t)).sum()) <= k


@pytest.mark.parametrize("d,k", [(100, 10), (1000, 100), (199210, 19921)])
def test_bisect_kernel_keeps_k_of_zeros_and_subnormals_by_index(d, k):
  # XLA:CPU compares with subnormals flushed to zero: the threshold just above an
  # all-zero vector (the smallest subnormal) compared as 0 and kept all d. This is
  # public_topk's first round (the previous global update starts at zero). The
  # threshold stays above zero (keeps none); the mask fills the tie at zero by
  # index up to k, as lax.top_k does (subnormals compare as zero here).
  key = jax.random.PRNGKey(0)
  first_k = np.arange(d) < k
  for x in (jnp.zeros(d), jnp.zeros(d).at[:k // 2].set(1e-40), -jnp.zeros(d)):
    np.testing.assert_array_equal(topk_kernels.topk_mask_bisect(x, k, key), first_k)
    np.testing.assert_array_equal(topk_kernels.topk_mask_exact(x, k), first_k)
    assert int(topk_kernels.count_at_least(jnp.abs(x), topk_kernels.kth_largest_threshold(
        jnp.abs(x), k, key))) == 0
  # normal values among zeros: those k // 2, then zeros by index up to k, never more
  x = jnp.zeros(d).at[k:k + k // 2].set(jnp.arange(1, k // 2 + 1, dtype=jnp.float32))
  m = np.asarray(topk_kernels.topk_mask_bisect(x, k, key))
  np.testing.assert_array_equal(m, np.asarray(topk_kernels.topk_mask_exact(x, k)))
  assert m.sum() == k and m[k:k + k // 2].all()


@pytest.mark.parametrize("d,k,bound", [(1000, 100, 0.05), (199210, 19921, 0.05),
                                       (199210, 19921, 0.001)])
def test_bisect_kernel_keeps_exactly_k_when_values_tie_at_a_clip_bound(d, k, bound):
  """Per-coordinate clipping puts many coordinates at exactly +-C; with more of them
  than k the k-th magnitude is a tie, which a threshold keeps or drops whole. The
  search used to return the threshold above the tie: an empty upload (c = 0). Now
  the tie is filled by index: exactly the top k, the lowest tied indices first,
  lax.top_k's choice."""
  rng = np.random.default_rng(d)
  x = jnp.clip(jnp.asarray(rng.normal(size=d) * 0.05, jnp.float32), -bound, bound)
  assert int(jnp.sum(jnp.abs(x) == bound)) > k            # a tie at the k-th value
  m = np.asarray(topk_kernels.topk_mask_bisect(x, k, jax.random.PRNGKey(2)))
  np.testing.assert_array_equal(m, np.asarray(topk_kernels.topk_mask_exact(x, k)))


def test_bisect_kernel_stops_within_its_tolerance_and_fills_when_passes_run_out():
  rng = np.random.default_rng(21)
  x = jnp.asarray(rng.standard_t(2.0, size=50_000), jnp.float32)
  k, a = 5_000, np.abs(np.asarray(x))
  for tol in (1e-3, 1e-2):
    m = np.asarray(topk_kernels.topk_mask_bisect(x, k, jax.random.PRNGKey(0), tol=tol))
    assert (1 - tol) * k <= m.sum() <= k and a[m].min() >= a[~m].max()   # an exact top c
  # no refining pass: the sampled bracket's hi, then the bracket's lowest indices up to k
  lo, hi, c_lo, c_hi = (np.asarray(v) for v in topk_kernels._magnitude_bracket(
      x, k, jax.random.PRNGKey(0), 4096, 0, 1e-3))
  assert c_hi < 0.99 * k < k < c_lo
  m = np.asarray(topk_kernels.topk_mask_bisect(x, k, jax.random.PRNGKey(0), passes=0))
  band = np.flatnonzero((a >= lo) & (a < hi))
  want = (a >= hi)
  want[band[:k - int(c_hi)]] = True
  np.testing.assert_array_equal(m, want)
  assert m.sum() == k


def test_public_topk_bisect_sends_the_first_k_in_round_zero():
  # the previous global update starts at zero: a tie everywhere, filled by index
  # (as the exact kernel does), never more than k
  stage = pl.topk_with_error_feedback(0.9, "public_topk", kernel="bisect")
  v = jax.random.normal(jax.random.PRNGKey(1), (D,))
  sent, residual, _ = stage.update(upload(v), stage.init(D), ctx())   # public update: zeros
  np.testing.assert_array_equal(sent.sent, np.arange(D) < 100)
  np.testing.assert_array_equal(np.asarray(sent.values) + np.asarray(residual), np.asarray(v))


def test_bisect_kernel_in_the_stage_and_downlink_conserves_mass():
  rng = np.random.default_rng(6)
  stage = pl.topk_with_error_feedback(0.9, kernel="bisect")
  u = rng.normal(size=D)
  out, residual, _ = stage.update(upload(u), stage.init(D), ctx())
  assert 99 <= int(out.sent.sum()) <= 100
  np.testing.assert_array_equal(np.asarray(out.values) + np.asarray(residual),
                                np.asarray(u, np.float32))
  v, r = jnp.asarray(rng.normal(size=D), jnp.float32), jnp.asarray(rng.normal(size=D), jnp.float32)
  sent, mask, new_r = pl.downlink_topk(v, r, 0.9, jax.random.PRNGKey(1), "bisect")
  np.testing.assert_array_equal(np.asarray(sent) + np.asarray(new_r), np.asarray(v + r))
  assert 99 <= int(mask.sum()) <= 100


def test_aggregate_noise_variance_against_a_loop():
  rng = np.random.default_rng(7)
  w, std = rng.uniform(0.1, 1, size=5), rng.uniform(0.5, 2, size=5)
  sent = rng.uniform(size=(5, 40)) < 0.3
  want = [sum(w[i] ** 2 * std[i] ** 2 for i in range(5) if sent[i, c]) for c in range(40)]
  np.testing.assert_allclose(pl.aggregate_noise_var(jnp.asarray(w), jnp.asarray(std),
                                                    jnp.asarray(sent)), want, rtol=1e-5)
  # the deferred stage records the std and leaves the values alone
  stage = pl.chain(pl.topk_with_error_feedback(0.9), pl.gaussian_on_kept(lambda c: 2.0,
                                                                       draw="aggregate"))
  u = rng.normal(size=D)
  out, _, _ = stage.update(upload(u), stage.init(D), ctx())
  assert float(out.noise_std) == 2.0
  np.testing.assert_array_equal(np.asarray(out.values)[np.asarray(out.sent)],
                                np.asarray(u, np.float32)[np.asarray(out.sent)])


@pytest.mark.parametrize("draw", ["client", "aggregate"])
def test_kept_noise_in_the_round_has_the_closed_form_variance(draw):
  """Both draws give the aggregate N(0, sigma^2 sum_i w_i^2 sent_ic) per coordinate,
  with w_i = n_i / n, and nothing where no client sent (masks from numpy top-k)."""
  x, y, parts = toy_problem(sizes=(8, 9, 10, 11))
  common = dict(hidden=[64], s_local=0.5, coordinate_clip=1e3)
  clean = toy_simulation(x, y, parts, **common)
  noisy = toy_simulation(x, y, parts, kept_noise="multiplier", kept_noise_multiplier=1e-3,
                         kept_noise_draw=draw, **common)
  s0 = keyed_state(clean)   # the noisy run draws the same (another release)
  deltas = [flat(d) for d in round_zero_deltas(clean, s0)]
  c1, _ = clean.run_rounds(s0, 1, same_draws=True)
  n1, _ = noisy.run_rounds(keyed_state(noisy), 1, same_draws=True)
  noise = flat(n1.params) - flat(c1.params)
  d = deltas[0].size
  k = pl.keep_count(d, 0.5)
  w = np.array([8, 9, 10, 11], float) / 38
  var = np.zeros(d)
  for wi, v in zip(w, deltas):
    m = np.zeros(d, bool)
    m[np.argsort(-np.abs(v), kind="stable")[:k]] = True
    var += wi ** 2 * 1.0 ** 2 * m          # sigma = multiplier * clip = 1
  assert np.all(np.abs(noise[var == 0]) < 1e-5) and (var == 0).sum() > 0
  z2 = noise[var > 0] ** 2 / var[var > 0]
  assert abs(z2.mean() - 1.0) < 4.5 * np.sqrt(2.0 / z2.size)
  assert stats.kstest(noise[var > 0] / np.sqrt(var[var > 0]), "norm").pvalue > 1e-3


def test_a_kept_noise_draw_without_kept_noise_is_refused():
  with pytest.raises(ConfigError, match=r"^config key 'kept_noise_draw' = 'client' with "
                                        r"kept_noise 'none': there is no kept noise to draw"):
    make_config({"kept_noise_draw": "client"})


def test_aggregate_noise_draw_refused_with_dp():
  with pytest.raises(ConfigError, match="'kept_noise_draw' = 'aggregate' with dp 'local'"):
    make_config({"algorithm": "topksdp", "kept_noise_draw": "aggregate", "dp": "local",
                 "noise_multiplier": 1.0, "kept_noise": "multiplier", "coordinate_clip": 0.1})


def _top_k_reference(x, k):
  """numpy: the k largest |x|, NaN never, ties (infinities included) by lowest index."""
  a = np.abs(np.asarray(x, np.float64))
  a = np.where(np.isnan(a), -1.0, a)
  keep = np.zeros(a.size, bool)
  keep[np.argsort(-a, kind="stable")[:min(k, int((a >= 0).sum()))]] = True
  return keep


def test_bisect_kernel_with_infinities_nans_and_values_near_float_max():
  """Found by an audit: the search did arithmetic on +-inf and NaN thresholds. More
  than k infinities kept 200 of k = 100; fewer than k dropped infinities for
  smaller values; one sampled NaN made the choice by index; 0.5 (lo + hi)
  overflowed near float max. Each against numpy's top-k."""
  rng = np.random.default_rng(1)
  bisect = jax.jit(topk_kernels.topk_mask_bisect, static_argnums=1)
  f = lambda v, k: bisect(v, k, jax.random.PRNGKey(0))
  x = rng.standard_normal(8192).astype(np.float32)
  x[1:400:2] = np.inf                                   # 200 > k, unseen by the sample
  np.testing.assert_array_equal(f(x, 100), _top_k_reference(x, 100))
  x = rng.standard_normal(100_000).astype(np.float32)
  x[rng.choice(100_000, 500, replace=False)] = -np.inf  # 500 < k
  m, want = np.asarray(f(x, 1000)), _top_k_reference(x, 1000)
  assert np.isinf(x[m]).sum() == 500 and 999 <= m.sum() <= 1000 and not (m & ~want).any()
  np.testing.assert_array_equal(f(np.array([1.0, 5.0, np.nan], np.float32), 1), [0, 1, 0])
  x = rng.standard_normal(100_000).astype(np.float32)
  x[:17] = np.nan                                       # the sample always holds one
  np.testing.assert_array_equal(f(x, 10), _top_k_reference(x, 10))
  x = np.where(rng.random(50_000) < 0.5, np.float32(2e38),
               np.float32(3.3e38) - rng.random(50_000).astype(np.float32) ** 40
               * np.float32(1e38)).astype(np.float32)
  m = np.asarray(f(x, 30_000))
  assert m.sum() == 30_000 and np.abs(x[m]).min() >= np.abs(x[~m]).max()
  x = np.full(1000, np.nan, np.float32)
  x[::100] = 1.0                                        # only 10 values that are not NaN
  np.testing.assert_array_equal(f(x, 50), _top_k_reference(x, 50))
