"""The sensitivity analyzer: each client scores its own features, the server maps
the scores to tiers (the dynamic-DP paper, section 3.2).

Per client, on its local data x [n, F] (jitted once for the padded client size):
  statistical branch   `sensitivity.statistical_scores`, a [0, 1] score per feature
  semantic branch      the int8 student (`semantic.py`) on each feature's
                       descriptor, semantic score = P(high) + P(medium) / 2
  fusion               score = 0.6 stat + 0.4 sem
  thresholds           high if score > 0.7, medium if in (0.3, 0.7], low if <= 0.3

The server averages the clients' fused scores per feature (weighted by client
size) and applies the thresholds; features the metadata marks public or
metadata keep that tier (the paper's fourth and fifth tiers come from
metadata, not from the scores).

A feature's descriptor (`feature_descriptors`, DESCRIPTOR_NAMES) is built from
the client's data only: the three statistical scores, shape statistics
(distinct-value fraction, discreteness, integrality, skewness, kurtosis,
quantiles of the standardized values), the largest bin's mass, and its mean
and largest |correlation| with the other features.

The semantic network is trained on labelled descriptors of a separately drawn
synthetic cohort (`training_set`: the healthcare generator with another seed,
cut into client-sized chunks). On healthcare data its tier accuracy therefore
measures how well it recognizes the generator's feature groups, not transfer
to real data; the report says so.

Privacy: the analyzer reads private data and its output (the tier map) is not
noised; the run's privacy report lists that as not accounted.
"""

from __future__ import annotations

import functools
import os
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.privacy.tiers import semantic, semantic_cache
from fedjax_dp.privacy.tiers import sensitivity
from fedjax_dp.data.tabular import HIGH, LOW, MEDIUM, PUBLIC, TIERS

STAT_WEIGHT, SEM_WEIGHT = 0.6, 0.4
HIGH_ABOVE, LOW_AT_MOST = 0.7, 0.3
DESCRIPTOR_NAMES = ("entropy_score", "correlation_score", "kl_score", "discrete",
                    "distinct_fraction", "integer_valued", "skewness", "kurtosis",
                    "q05", "q25", "q50", "q75", "q95", "top_bin_mass",
                    "mean_abs_corr_others", "max_abs_corr_others")
REFERENCE_SIZE = 512


def reference_sample(features: int, seed: int = 0):
  """The per-feature histograms (lo [F], hi [F], q [F, 32]) of a standard-normal
  reference sample [REFERENCE_SIZE, F]: public and data-free (the features are
  standardized, so it is the distribution of an unremarkable one). Computed once
  and shared by every client's pass."""
  rng = np.random.default_rng([seed, 1723])
  ref = jnp.asarray(rng.normal(size=(REFERENCE_SIZE, features)), jnp.float32)
  return jax.jit(jax.vmap(sensitivity.reference_histogram, in_axes=1))(ref)


@jax.jit
def feature_descriptors(x: jax.Array, mask: jax.Array, sensitive: jax.Array,
                        reference) -> tuple[jax.Array, jax.Array]:
  """(descriptors [F, len(DESCRIPTOR_NAMES)], statistical score [F]) of one
  client's x [n, F] (rows with mask 0 are padding); sensitive [n, S];
  reference: `reference_sample`'s histograms."""
  m = mask.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(m), 2.0)
  stats = sensitivity.statistical_scores(x, sensitive, reference, mask=m)
  mean = (m @ x) / n
  xc = (x - mean) * m[:, None]
  sd = jnp.sqrt(jnp.sum(xc * xc, axis=0) / n)
  z = xc / jnp.maximum(sd, 1e-6)
  skew = jnp.sum(m[:, None] * z ** 3, axis=0) / n
  kurt = jnp.sum(m[:, None] * z ** 4, axis=0) / n - 3.0
  distinct = jax.vmap(lambda c: sensitivity.distinct_values(c, m), in_axes=1)(x)
  # quantiles of the standardized values: padding sorts to the end as +inf
  zs = jnp.sort(jnp.where(m[:, None] > 0, z, jnp.inf), axis=0)
  k = jnp.sum(m)
  q = jnp.stack([zs[jnp.clip(jnp.floor(p * (k - 1)).astype(jnp.int32), 0, x.shape[0] - 1)]
                 for p in (0.05, 0.25, 0.5, 0.75, 0.95)], axis=1)          # [F, 5]
  top_bin = jax.vmap(lambda c: jnp.max(sensitivity.histogram(
      c, *sensitivity._masked_min_max(c, m), 16, m)) / n, in_axes=1)(x)
  # integer-valued on the raw scale is lost by standardizing; steps of equal size are not:
  # a feature whose distinct values sit on a lattice of step = its smallest gap
  gaps = jnp.diff(jnp.sort(jnp.where(m[:, None] > 0, x, jnp.inf), axis=0), axis=0)
  real_gap = (gaps > 1e-6 * jnp.maximum(sd, 1e-6)) & jnp.isfinite(gaps)
  step = jnp.min(jnp.where(real_gap, gaps, jnp.inf), axis=0)
  ratio = jnp.where(real_gap, gaps / jnp.where(jnp.isfinite(step), step, 1.0), 0.0)
  lattice = jnp.all(jnp.abs(ratio - jnp.round(ratio)) < 1e-3, axis=0)
  corr = (z.T @ z) / n                                                       # [F, F]
  corr = jnp.abs(corr) * (1.0 - jnp.eye(x.shape[1]))
  f = x.shape[1]
  desc = jnp.stack([
      stats["entropy_score"], stats["correlation_score"], stats["kl_score"],
      stats["discrete"].astype(jnp.float32),
      jnp.log(distinct.astype(jnp.float32)) / jnp.log(n),
      lattice.astype(jnp.float32),
      jnp.tanh(skew / 3.0), jnp.tanh(kurt / 10.0),
      *[jnp.clip(q[:, j], -5.0, 5.0) / 5.0 for j in range(5)],
      top_bin,
      jnp.sum(corr, axis=1) / jnp.maximum(f - 1, 1), jnp.max(corr, axis=1)], axis=1)
  return jnp.nan_to_num(desc), stats["score"]


def _chunks(n: int, size: int, rng) -> list[np.ndarray]:
  order = rng.permutation(n)
  return [order[i:i + size] for i in range(0, n - size + 1, size)]


def pad_rows(x: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
  """(x padded with zero rows to `rows`, mask [rows])."""
  out = np.zeros((rows,) + x.shape[1:], np.float32)
  out[:len(x)] = x
  return out, np.arange(rows) < len(x)


@functools.lru_cache(maxsize=4)
def training_set(seed: int = 0, examples: int = 3000, chunk: int = 50):
  """Labelled descriptors (x [m, D], tier y [m] in high/medium/low) from a
  healthcare cohort drawn with another seed than any run's data, cut into
  client-sized chunks."""
  from fedjax_dp.data.tabular import healthcare_data
  x, _, tiers, _, sensitive = healthcare_data(examples, seed=10_000 + seed)
  x = (x - x.mean(0)) / (x.std(0) + 1e-9)
  ref = reference_sample(x.shape[1], seed)
  keep = tiers <= LOW
  rng = np.random.default_rng(seed)
  descs = []
  for idx in _chunks(len(x), chunk, rng):
    d, _ = feature_descriptors(jnp.asarray(x[idx]), jnp.ones(len(idx), bool),
                               jnp.asarray(x[idx][:, sensitive]), ref)
    descs.append(np.asarray(d)[keep])
  xs = np.concatenate(descs)
  ys = np.tile(tiers[keep], len(descs)).astype(np.int32)
  return xs, ys


class SemanticModel(NamedTuple):
  """The trained semantic branch: float teacher, pruned student, int8 student."""
  teacher: list                      # [(W, b)] float32
  student: semantic.Student
  quantized: semantic.QuantizedMLP
  train_accuracy: dict               # stage -> accuracy on the training descriptors
  bytes: dict                        # stage -> bytes of its parameters
  training_examples: int
  source: str = "trained"            # 'trained', or 'cache <file>' where it was loaded


# float32 products on every platform (a GPU's default is TF32, JAX_NOTES.md): the
# network and the scores are then the same numbers as on the CPU, to rounding
@jax.default_matmul_precision("float32")
def train_semantic_model(seed: int = 0, steps: int = 1500) -> SemanticModel:
  """Teacher, distilled and pruned student, int8 student on `training_set(seed)`."""
  xs, ys = training_set(seed)
  key = jax.random.PRNGKey(seed)
  x, y = jnp.asarray(xs), jnp.asarray(ys)
  teacher = jax.jit(semantic.train_teacher, static_argnums=(3,))(
      jax.random.fold_in(key, 0), x, y, steps)
  train = jax.jit(functools.partial(semantic.distill_student, steps=steps,
                                    finetune_steps=steps // 3))
  student = train(jax.random.fold_in(key, 1), teacher, x, y)
  quantized = semantic.quantize_int8(student.params)
  # training accuracy of each stage (held-out accuracy is the run's tier accuracy)
  acc = lambda logits: float(jnp.mean(jnp.argmax(logits, -1) == y))
  return SemanticModel(
      teacher, student, quantized,
      train_accuracy={"teacher": acc(semantic.mlp_logits(teacher, x)),
                      "student_pruned": acc(semantic.mlp_logits(student.params, x)),
                      "student_int8": acc(semantic.quantized_logits(quantized, x))},
      bytes={"teacher_float32": semantic.param_bytes(teacher),
             "student_float32": semantic.param_bytes(student.params),
             "student_int8": semantic.param_bytes(quantized),
             "student_int8_sparse": semantic.sparse_bytes(quantized, student.mask)},
      training_examples=int(len(ys)))


def _model_arrays(m: SemanticModel) -> dict[str, np.ndarray]:
  out = {"student_mask": np.asarray(m.student.mask)}
  for name, layers in (("teacher", m.teacher), ("student", m.student.params),
                       ("int8", zip(m.quantized.weights, m.quantized.biases))):
    for i, (w, b) in enumerate(layers):
      out[f"{name}_w{i}"], out[f"{name}_b{i}"] = np.asarray(w), np.asarray(b)
  for i, s in enumerate(m.quantized.scales):
    out[f"int8_s{i}"] = np.asarray(s)
  return out


def _model_from_arrays(a: dict[str, np.ndarray], meta: dict, source: str) -> SemanticModel:
  layers = lambda name: [(jnp.asarray(a[f"{name}_w{i}"]), jnp.asarray(a[f"{name}_b{i}"]))
                         for i in range(sum(k.startswith(f"{name}_w") for k in a))]
  int8 = layers("int8")
  return SemanticModel(
      layers("teacher"), semantic.Student(layers("student"), jnp.asarray(a["student_mask"])),
      semantic.QuantizedMLP([w for w, _ in int8],
                            [jnp.asarray(a[f"int8_s{i}"]) for i in range(len(int8))],
                            [b for _, b in int8]),
      meta["train_accuracy"], meta["bytes"], meta["training_examples"], source)


@functools.lru_cache(maxsize=4)
def semantic_model(seed: int = 0, steps: int = 1500) -> SemanticModel:
  """The trained network: remembered in this process, and on disk between runs
  (`semantic_cache`: loaded only where everything its training reads is unchanged)."""
  folder = semantic_cache.cache_dir()
  if folder is None:
    return train_semantic_model(seed, steps)
  path = os.path.join(folder, semantic_cache.model_key(seed, steps) + ".npz")
  found = semantic_cache.load(path)
  if found is not None:
    return _model_from_arrays(*found, source=f"cache {path}")
  model = train_semantic_model(seed, steps)
  semantic_cache.save(path, _model_arrays(model), {
      "seed": seed, "steps": steps, "train_accuracy": model.train_accuracy,
      "bytes": model.bytes, "training_examples": model.training_examples})
  return model


def thresholds(score: np.ndarray) -> np.ndarray:
  """Tier indices (HIGH, MEDIUM, LOW) of fused scores: > 0.7, (0.3, 0.7], <= 0.3."""
  score = np.asarray(score)
  return np.where(score > HIGH_ABOVE, HIGH, np.where(score > LOW_AT_MOST, MEDIUM, LOW)).astype(
      np.int32)


@functools.partial(jax.jit, static_argnums=())
def _score_client(q: semantic.QuantizedMLP, x, mask, sensitive, reference):
  desc, stat = feature_descriptors(x, mask, sensitive, reference)
  probs = jax.nn.softmax(semantic.quantized_logits(q, desc))
  sem = probs[:, HIGH] + 0.5 * probs[:, MEDIUM]
  return stat, sem, STAT_WEIGHT * stat + SEM_WEIGHT * sem, jnp.argmax(probs, -1)


RULES = ("fused", "semantic", "statistical")


@jax.default_matmul_precision("float32")
def _tier_accuracy(known_tiers, tiers, stat, sem, fused, fused_c, cls_c) -> dict:
  """The analyzer's tiers against the known ones: the run's, each branch's, and the
  median client's. [F] arrays but fused_c [clients, F] and cls_c [clients, F]."""
  scored = known_tiers <= LOW
  client_sem_tiers = cls_c[:, scored]
  ok_clients = np.isfinite(fused_c[:, 0])
  known = known_tiers[scored]
  return {
      "is": "fraction of the features with a known high/medium/low tier that get it "
            "(public and metadata come from metadata and are not scored)",
      "features_scored": int(scored.sum()),
      "run_tiers": float(np.mean(tiers[scored] == known)),
      "fused": float(np.mean(thresholds(fused)[scored] == known)),
      "statistical_only": float(np.mean(thresholds(stat)[scored] == known)),
      "semantic_only": float(np.mean(thresholds(sem)[scored] == known)),
      "semantic_argmax_per_client_median": float(np.median(np.mean(
          client_sem_tiers[ok_clients] == known[None, :], axis=1))),
      "fused_per_client_median": float(np.median(np.mean(
          thresholds(fused_c[ok_clients][:, scored]) == known[None, :], axis=1))),
      "paper": 0.94,
  }


def analyze_clients(x_train: np.ndarray, parts: list[np.ndarray], sensitive: np.ndarray | None,
                    known_tiers: np.ndarray | None = None, seed: int = 0,
                    semantic_steps: int = 1500, rule: str = "fused") -> dict:
  """Runs the analyzer on every client's data and maps the scores to tiers.

  `rule` picks the score the thresholds read: 'fused' (the paper's), or one
  branch alone (for ablations). Returns a dict: tiers int32 [F] (the run's
  tier map), stat/sem/fused float [F] (client-size-weighted means),
  client_fused [clients, F], and a report (tier accuracy against `known_tiers`
  per branch, memory, time)."""
  if rule not in RULES:
    raise ValueError(f"analyzer rule {rule!r}: allowed values are {', '.join(RULES)}")
  t_train = time.perf_counter()
  model = semantic_model(seed, semantic_steps)    # trained, or loaded (semantic_cache)
  train_s = time.perf_counter() - t_train
  f = x_train.shape[1]
  sens_cols = np.flatnonzero(sensitive) if sensitive is not None else np.zeros(0, int)
  ref = reference_sample(f, seed)
  rows = max(2, max(len(p) for p in parts))
  sizes = np.array([len(p) for p in parts], np.float64)
  stat_c, sem_c, fused_c, cls_c = [], [], [], []
  args = lambda p: (lambda xp, mp: (jnp.asarray(xp), jnp.asarray(mp),
                                    jnp.asarray(xp[:, sens_cols]), ref))(
      *pad_rows(x_train[p], rows))
  compiled = _score_client.lower(model.quantized, *args(parts[0])).compile()
  memory = compiled.memory_analysis()
  t0 = time.perf_counter()
  for p in parts:
    if len(p) < 2:  # nothing to estimate from: the client reports no scores
      stat_c.append(np.full(f, np.nan)), sem_c.append(np.full(f, np.nan))
      fused_c.append(np.full(f, np.nan)), cls_c.append(np.full(f, -1))
      continue
    out = compiled(model.quantized, *args(p))
    s, m, fu, c = (np.asarray(o) for o in out)
    stat_c.append(s), sem_c.append(m), fused_c.append(fu), cls_c.append(c)
  seconds = time.perf_counter() - t0
  stat_c, sem_c, fused_c = np.array(stat_c), np.array(sem_c), np.array(fused_c)
  w = np.where(np.isnan(fused_c[:, 0]), 0.0, sizes)[:, None]
  mean = lambda a: np.nansum(a * w, axis=0) / max(w.sum(), 1e-12)
  stat, sem, fused = mean(stat_c), mean(sem_c), mean(fused_c)
  tiers = thresholds({"fused": fused, "semantic": sem, "statistical": stat}[rule])
  if known_tiers is not None:  # public and metadata come from the metadata
    known_tiers = np.asarray(known_tiers)
    tiers = np.where(known_tiers >= PUBLIC, known_tiers, tiers).astype(np.int32)
  report = {
      "rule": rule,
      "fusion": f"{STAT_WEIGHT} statistical + {SEM_WEIGHT} semantic; high > {HIGH_ABOVE}, "
                f"medium in ({LOW_AT_MOST}, {HIGH_ABOVE}], low <= {LOW_AT_MOST}",
      "tier_counts": {TIERS[t]: int(np.sum(tiers == t)) for t in range(len(TIERS))},
      "semantic_training": {
          "examples": model.training_examples,
          "source": f"healthcare generator, seed {10_000 + seed}, chunks of 50 records",
          "network": model.source,
          "train_accuracy": model.train_accuracy},
      "memory_bytes": {**model.bytes,
                       "client_pass_temp": int(getattr(memory, "temp_size_in_bytes", 0) or 0),
                       "client_pass_arguments": int(
                           getattr(memory, "argument_size_in_bytes", 0) or 0)},
      "seconds": {"all_clients": seconds, "per_client": seconds / max(len(parts), 1),
                  "semantic_training": train_s},
  }
  if known_tiers is not None:
    report["tier_accuracy"] = _tier_accuracy(known_tiers, tiers, stat, sem, fused,
                                             fused_c, np.array(cls_c))
  return {"tiers": tiers, "stat": stat, "sem": sem, "fused": fused, "client_fused": fused_c,
          "report": report}
