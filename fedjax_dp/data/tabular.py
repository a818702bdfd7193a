"""Tabular data with sensitivity tiers (the dynamic-DP paper's setting).

Tiers, most to least sensitive: high, medium, low, public, metadata (TIERS;
a feature's tier is its index in TIERS). Three sources:

* `healthcare_data`: a synthetic healthcare cohort with the paper's feature
  groups and known tiers (the paper's ADNI/EHR data cannot be had):
    genotype      305 features, minor-allele counts in {0, 1, 2}     high
    clinical      178 clinical scores (bounded, rounded test scores)  medium
    demographics   42 features of mixed tiers: 10 high (e.g. ethnicity),
                   12 medium, 10 low, 6 public, 4 metadata (site, visit)
    imaging       322 continuous imaging measures (log-normal volumes) low
  847 features, 3 classes (healthy / mild / severe) that depend on several
  groups, by one of two generators (`generator`: logits, the default, or
  severity, which an MLP learns as the paper's data is learned; see
  healthcare_data). `sensitive` marks the demographic columns that are
  sensitive attributes (the analyzer correlates features with them).
* `breast_cancer_data`: scikit-learn's shipped breast-cancer set (569 x 30, 2
  classes); its tiers are not known (None).
* `read_tier_map`: a tier map for CSV input, either a CSV file with columns
  `feature,tier` or a JSON object {feature: tier}; every feature must be
  mapped, and unknown names or tiers are one-line errors.

`load_healthcare`, `load_breast_cancer` and `load_synthetic` (Gaussian class
clusters, no tiers) return the built-in tabular datasets as Datasets, split
into training and test rows, features raw (load_dataset scales them).
"""

from __future__ import annotations

import csv
import json
import math
import os

import numpy as np

from fedjax_dp.data.dataset import Dataset, train_test_split
from fedjax_dp.errors import DataError

TIERS = ("high", "medium", "low", "public", "metadata")
HIGH, MEDIUM, LOW, PUBLIC, METADATA = range(5)

DEMOGRAPHIC_TIERS = [HIGH] * 10 + [MEDIUM] * 12 + [LOW] * 10 + [PUBLIC] * 6 + [METADATA] * 4
GROUPS = (("genotype", 305), ("clinical", 178), ("demographics", 42), ("imaging", 322))


class TierMapError(ValueError):
  """A missing or bad tier map; one line."""


GENERATORS = ("logits", "severity")


def healthcare_data(num_examples: int = 5000, seed: int = 0, generator: str = "logits"):
  """(x float32 [n, 847] raw (unstandardized), y int32 [n], tiers int32 [847],
  names list[str], sensitive bool [847]) from one of two generators (GENERATORS):

  logits    the class is the argmax of noisy logits, linear in 20 risk alleles,
            30 clinical scores, 40 log imaging measures and age (the first
            generator, the default, which every committed healthcare result
            used: a centralised logistic regression reaches 83 % on 5,000
            patients, 91 % on 20,000).
  severity  a disease process: a latent severity s (12 risk alleles, one of
            large effect carried dominantly as APOE-e4 is, age, and unmeasured
            causes) sets the class by thresholds (40 / 30 / 30 %); 140 of the 178
            clinical scores rise with s and 250 of the 322 imaging volumes
            shrink with it (atrophy), each with little noise, so the markers
            measure s closely: a 256-128-64 MLP learns the class to 95.2-95.6 %
            from 4,000 patients and 96.4 % from 6,400 (scikit-learn's, seeds
            0-2), where the logits generator's logistic regression stops at 83 %
            (5,000). Under strong label skew a client sees about one stage of
            the disease, which federated training feels (tests/test_tabular.py)."""
  if generator not in GENERATORS:
    raise DataError(f"healthcare: generator {generator!r}; allowed: {', '.join(GENERATORS)}")
  rng = np.random.default_rng([seed, 847] if generator == "logits" else [seed, 847, 2])
  make = _logits_cohort if generator == "logits" else _severity_cohort
  geno, clinical, demo, imaging, y = make(rng, num_examples)
  return _cohort(geno, clinical, demo, imaging, y)


def _demographics(rng, n: int, age: np.ndarray) -> np.ndarray:
  demo = rng.normal(size=(n, 42))
  demo[:, 0] = rng.integers(0, 5, size=n)                      # ethnicity (categorical code)
  demo[:, 1] = rng.integers(0, 2, size=n)                      # sex
  demo[:, 10] = age
  demo[:, 38:42] = rng.integers(0, 12, size=(n, 4))            # site, visit, ...: metadata
  return demo


def _logits_cohort(rng, n: int):
  """The logits generator's groups and labels (its draws in their first order)."""
  maf = rng.uniform(0.05, 0.5, size=305)                       # minor-allele frequencies
  geno = rng.binomial(2, maf, size=(n, 305)).astype(np.float64)
  latent = rng.normal(size=(n, 4))                              # shared disease factors
  load = rng.normal(size=(4, 178)) * 0.6
  clinical = np.clip(np.round(20 + 5 * (latent @ load + rng.normal(size=(n, 178)))), 0, 40)
  age = rng.uniform(50, 90, size=n)
  demo = _demographics(rng, n, age)
  img_load = rng.normal(size=(4, 322)) * 0.3
  imaging = np.exp(0.5 * (latent @ img_load) + 0.3 * rng.normal(size=(n, 322)) - 0.01 * (age[:, None] - 70))
  # class logits from several groups: risk alleles, clinical scores, imaging, age
  w_geno = np.zeros((305, 3))
  w_geno[rng.choice(305, 20, replace=False)] = rng.normal(size=(20, 3)) * 1.5
  w_clin = np.zeros((178, 3))
  w_clin[rng.choice(178, 30, replace=False)] = rng.normal(size=(30, 3)) * 0.08
  w_img = np.zeros((322, 3))
  w_img[rng.choice(322, 40, replace=False)] = rng.normal(size=(40, 3)) * 0.8
  logits = ((geno - 2 * maf) @ w_geno + (clinical - 20) @ w_clin + np.log(imaging) @ w_img
            + np.outer((age - 70) / 10, [-0.5, 0.0, 0.5]))
  logits += rng.gumbel(size=logits.shape) * 0.5
  y = np.argmax(logits, axis=1).astype(np.int32)
  return geno, clinical, demo, imaging, y


def _severity_cohort(rng, n: int):
  """The severity generator's groups and labels (healthcare_data)."""
  maf = rng.uniform(0.05, 0.5, size=305)
  geno = rng.binomial(2, maf, size=(n, 305)).astype(np.float64)
  age = rng.uniform(50, 90, size=n)
  risk = rng.choice(305, 12, replace=False)
  effect = np.abs(rng.normal(size=12)) * 0.35
  severity = ((geno[:, risk] - 2 * maf[risk]) @ effect + 0.8 * (geno[:, risk[0]] > 0)
              + 0.05 * (age - 70) + 0.6 * rng.normal(size=n))
  y = np.digitize(severity, np.quantile(severity, [0.4, 0.7])).astype(np.int32)
  s = (severity - severity.mean()) / severity.std()
  load = np.zeros(178)
  load[rng.choice(178, 140, replace=False)] = rng.uniform(0.5, 1.5, 140)
  unrelated = rng.normal(size=(n, 4)) @ (rng.normal(size=(4, 178)) * 0.5)
  clinical = np.clip(np.round(20 + 6 * (np.outer(s, load)
                                        + 0.2 * (rng.normal(size=(n, 178)) + unrelated))), 0, 40)
  shrink = np.zeros(322)
  shrink[rng.choice(322, 250, replace=False)] = rng.uniform(0.1, 0.3, 250)
  imaging = np.exp(-np.outer(s, shrink) + 0.04 * rng.normal(size=(n, 322))
                   - 0.005 * (age[:, None] - 70))
  return geno, clinical, _demographics(rng, n, age), imaging, y


def _cohort(geno, clinical, demo, imaging, y):
  """The generators' common columns: x, y, tiers, names, sensitive."""
  x = np.concatenate([geno, clinical, demo, imaging], axis=1).astype(np.float32)
  tiers = np.array([HIGH] * 305 + [MEDIUM] * 178 + DEMOGRAPHIC_TIERS + [LOW] * 322, np.int32)
  demo_names = [f"demo_{j}" for j in range(42)]
  demo_names[0], demo_names[1], demo_names[10] = "demo_ethnicity", "demo_sex", "demo_age"
  demo_names[38:42] = ["meta_site", "meta_visit", "meta_scanner", "meta_batch"]
  names = ([f"snp_{i}" for i in range(305)] + [f"clinical_{i}" for i in range(178)]
           + demo_names + [f"imaging_{i}" for i in range(322)])
  sensitive = np.zeros(847, bool)
  sensitive[[483, 484, 493]] = True
  return x, y, tiers, names, sensitive


def breast_cancer_data():
  """(x float32 [569, 30], y int32 [569], feature names): scikit-learn, shipped."""
  from sklearn.datasets import load_breast_cancer
  d = load_breast_cancer()
  return d.data.astype(np.float32), d.target.astype(np.int32), [str(n) for n in d.feature_names]


def read_tier_map(path: str, features: list[str]) -> np.ndarray:
  """int32 [len(features)] tiers from a `feature,tier` CSV or a JSON object."""
  if not os.path.isfile(path):
    raise TierMapError(f"{path}: no such tier map file")
  try:
    with open(path, encoding="utf-8-sig") as f:
      text = f.read()
  except UnicodeDecodeError:
    raise TierMapError(f"{path}: not UTF-8 text, expected a feature,tier CSV or a JSON object")
  if path.endswith(".json"):
    try:
      mapping = json.loads(text)
    except json.JSONDecodeError as e:
      raise TierMapError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})")
    if not isinstance(mapping, dict):
      raise TierMapError(f"{path}: expected a JSON object {{feature: tier}}")
  else:
    rows = [r for r in csv.reader(text.splitlines()) if r and any(c.strip() for c in r)]
    if rows and [c.strip().lower() for c in rows[0]] == ["feature", "tier"]:
      rows = rows[1:]
    mapping = {}
    for i, r in enumerate(rows):
      if len(r) != 2:
        raise TierMapError(f"{path}: row {i + 1} has {len(r)} fields, expected feature,tier")
      if r[0].strip() in mapping:   # which tier was meant is not ours to guess
        raise TierMapError(f"{path}: feature {r[0].strip()!r} is mapped twice (row {i + 1}); "
                           "map each feature once")
      mapping[r[0].strip()] = r[1].strip()
  unknown = [k for k in mapping if k not in features]
  if unknown:
    raise TierMapError(f"{path}: feature {unknown[0]!r} is not a column of the data "
                       f"(columns: {', '.join(features[:8])}{', ...' if len(features) > 8 else ''})")
  missing = [f for f in features if f not in mapping]
  if missing:
    raise TierMapError(f"{path}: feature {missing[0]!r} has no tier ({len(missing)} unmapped); "
                       f"map every feature to one of {', '.join(TIERS)}")
  out = np.empty(len(features), np.int32)
  for i, f in enumerate(features):
    tier = str(mapping[f]).strip().lower()
    if tier not in TIERS:
      raise TierMapError(f"{path}: feature {f!r} has tier {mapping[f]!r}; allowed are "
                         f"{', '.join(TIERS)}")
    out[i] = TIERS.index(tier)
  return out


def load_healthcare(num_examples: int = 5000, seed: int = 0, generator: str = "logits") -> Dataset:
  if num_examples < 10:
    raise DataError(f"healthcare: num_examples={num_examples}; expected >= 10")
  x, y, tiers, names, sensitive = healthcare_data(num_examples, seed, generator)
  tr, te = train_test_split(len(y), 0.2, seed)
  source = f"generated (seed {seed})" if generator == "logits" else (
      f"generated ({generator} generator, seed {seed})")
  return Dataset("healthcare", x[tr], y[tr], x[te], y[te], 3, source,
                 feature_names=tuple(names), feature_tiers=tiers, sensitive=sensitive)


def load_breast_cancer(seed: int = 0, tier_map: str | None = None) -> Dataset:
  """scikit-learn's breast cancer set; `tier_map` (a feature,tier CSV or a JSON object
  over its 30 feature names, e.g. 'mean radius') gives its columns sensitivity tiers."""
  x, y, names = breast_cancer_data()
  tiers = None
  if tier_map:
    try:
      tiers = read_tier_map(tier_map, names)
    except TierMapError as e:
      raise DataError(str(e)) from None
  tr, te = train_test_split(len(y), 0.2, seed)
  return Dataset("breast_cancer", x[tr], y[tr], x[te], y[te], 2, "scikit-learn load_breast_cancer",
                 feature_names=tuple(names), feature_tiers=tiers)


def load_synthetic(num_examples: int = 10000, num_features: int = 32, num_classes: int = 10,
                   seed: int = 0) -> Dataset:
  """Gaussian class clusters with unit noise and class means of norm ~2, so
  neighbouring classes overlap: a linear model reaches about 60-65 % on 10
  classes, well above chance but not perfect. The test set is 20 % extra draws."""
  if num_examples < 2 or num_features < 1 or num_classes < 2:
    raise DataError(f"synthetic: num_examples={num_examples}, num_features={num_features}, "
                    f"num_classes={num_classes}; expected >= 2, >= 1, >= 2")
  rng = np.random.default_rng(seed)
  means = rng.normal(size=(num_classes, num_features)) * 2.0 / math.sqrt(num_features)
  n_test = max(1, num_examples // 5)
  y = rng.integers(0, num_classes, size=num_examples + n_test).astype(np.int32)
  x = (means[y] + rng.normal(size=(len(y), num_features))).astype(np.float32)
  return Dataset("synthetic", x[:num_examples], y[:num_examples], x[num_examples:],
                 y[num_examples:], num_classes,
                 f"generated (seed {seed})")
