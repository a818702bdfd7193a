"""Membership inference on a trained global model: the loss-threshold attack.

Members are training examples (every client's data reaches the model over the
rounds), non-members test examples, as many of each (a balanced set, drawn with
`seed`). The attack scores an example by minus its loss under the model (Yeom et
al. 2018: the model fits what it saw) and is read at every threshold:

  accuracy          the best threshold's (TP + TN) / (2 n); 0.5 is chance
  auc               P(a member scores above a non-member), ties counted half
  tpr_at_1pct_fpr   the true-positive rate at the largest threshold set whose
                    false-positive rate is at most 1 % (Carlini et al. 2022)

Under (epsilon, delta)-DP any attack has TPR <= e^epsilon FPR + delta, so the
run's reported epsilon bounds the last figure: `dp_bound_tpr_at_1pct_fpr`. The
guarantee is client-level: with fixed-size cohorts (replace one client's data) an
example's membership is one neighbouring step; with Poisson sampling (add or
remove one client) it is two, remove the client and add it back without the
example, so group privacy of 2 applies: e^(2 epsilon) FPR + (1 + e^epsilon) delta.
Kept noise alone (dp none) guarantees each client's uploads, which covers an
example's membership only in some set-ups (experiment/attack.membership_privacy);
where nothing covers it the bound is None and `dp_bound_why_none` says why.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

FPR = 0.01


def roc_figures(member: np.ndarray, nonmember: np.ndarray) -> dict:
  """Accuracy (best threshold, balanced), AUC and TPR at 1 % FPR of scores where
  higher means "member"; member [n], nonmember [n'] (equal n gives the balanced
  accuracy the docstring defines; unequal, the mean of TPR and TNR)."""
  member, nonmember = np.asarray(member, np.float64), np.asarray(nonmember, np.float64)
  scores = np.concatenate([member, nonmember])
  # AUC by ranks (Mann-Whitney U), average ranks for ties
  order = np.argsort(scores, kind="mergesort")
  ranks = np.empty(len(scores))
  sorted_scores = scores[order]
  i = 0
  while i < len(scores):
    j = i
    while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
      j += 1
    ranks[order[i:j + 1]] = (i + j) / 2 + 1
    i = j + 1
  n1, n0 = len(member), len(nonmember)
  auc = (ranks[:n1].sum() - n1 * (n1 + 1) / 2) / (n1 * n0)
  # every threshold "score >= t" at the distinct scores, and t above them all; the
  # share at or above t by binary search in the sorted scores (no [t, n] matrix)
  thresholds = np.concatenate([np.unique(scores), [np.inf]])
  above = lambda s: (len(s) - np.searchsorted(np.sort(s), thresholds, side="left")) / len(s)
  tpr, fpr = above(member), above(nonmember)
  accuracy = float(np.max((tpr + 1 - fpr) / 2))
  return {"accuracy": accuracy, "auc": float(auc),
          "tpr_at_1pct_fpr": float(np.max(tpr[fpr <= FPR]))}


def example_losses(apply_fn, params, x: np.ndarray, y: np.ndarray, batch: int = 1000
                   ) -> np.ndarray:
  """[n] each example's cross-entropy under the model, in batches."""
  @jax.jit
  @jax.default_matmul_precision("float32")
  def losses(xb, yb):
    return optax.softmax_cross_entropy_with_integer_labels(apply_fn(params, xb), yb)
  out = [np.asarray(losses(jnp.asarray(x[i:i + batch]), jnp.asarray(y[i:i + batch])))
         for i in range(0, len(x), batch)]
  return np.concatenate(out) if out else np.zeros(0, np.float32)


def balanced_sets(n_train: int, n_test: int, examples: int | None, seed: int):
  """(member indices into train, non-member indices into test): n of each, n the
  smaller split (at most `examples`), drawn without replacement."""
  n = min(n_train, n_test, examples or n_train)
  rng = np.random.default_rng(seed)
  return (np.sort(rng.choice(n_train, n, replace=False)),
          np.sort(rng.choice(n_test, n, replace=False)))


def dp_tpr_bound(epsilon: float | None, delta: float | None, fpr: float = FPR,
                 steps: int = 1) -> float | None:
  """The most TPR an (epsilon, delta)-DP release allows at false-positive rate fpr,
  where an example's membership is `steps` neighbouring steps (group privacy:
  e^(k eps) and delta (e^(k eps) - 1) / (e^eps - 1), k = steps)."""
  if epsilon is None:
    return None
  d = delta or 0.0
  group_delta = d * steps if epsilon == 0 else d * math.expm1(steps * epsilon) / math.expm1(
      epsilon)
  return min(1.0, math.exp(steps * epsilon) * fpr + group_delta)


def membership_steps(neighbouring: str | None) -> int:
  """Neighbouring steps between a training set with and one without an example:
  one client's data replaced is one step; under add/remove of whole clients it
  takes two (remove the client, add it back without the example)."""
  return 2 if neighbouring and neighbouring.startswith("add/remove") else 1


def loss_threshold_attack(apply_fn, params, x_train, y_train, x_test, y_test, *,
                          examples: int | None = None, seed: int = 0,
                          epsilon: float | None = None, delta: float | None = None,
                          neighbouring: str | None = None, why_none: str | None = None
                          ) -> dict:
  """The loss-threshold attack's figures on a balanced member / non-member set;
  the DP bound from (epsilon, delta) of `neighbouring` neighbours, or none and
  `why_none` (dp_bound_why_none) where epsilon is None."""
  mem, non = balanced_sets(len(x_train), len(x_test), examples, seed)
  loss_in = example_losses(apply_fn, params, x_train[mem], y_train[mem])
  loss_out = example_losses(apply_fn, params, x_test[non], y_test[non])
  figures = roc_figures(-loss_in, -loss_out)
  return {"attack": "loss_threshold", "members": int(len(mem)), "nonmembers": int(len(non)),
          **figures, "member_loss_mean": float(loss_in.mean()),
          "nonmember_loss_mean": float(loss_out.mean()), "epsilon": epsilon, "delta": delta,
          "dp_bound_tpr_at_1pct_fpr": dp_tpr_bound(epsilon, delta,
                                                   steps=membership_steps(neighbouring)),
          "dp_bound_steps": membership_steps(neighbouring),
          "dp_bound_why_none": None if epsilon is not None else (
              why_none or "the run reports no epsilon")}


# ------------------------------------------------------------ the shadow-model attack


def train_shadow(model, x: np.ndarray, y: np.ndarray, *, epochs: int, batch: int, lr: float,
                 momentum: float, seed: int):
  """A shadow model: `model` trained from a fresh initialisation on (x, y) by plain
  minibatch SGD, centrally (the target's recipe without federation)."""
  key = jax.random.PRNGKey(seed)
  params = model.init(jax.random.fold_in(key, 0))
  opt = optax.sgd(lr, momentum=momentum or None)
  n = len(x) - len(x) % batch or len(x)
  steps = n // min(batch, n)
  b = n // steps

  @jax.jit
  @jax.default_matmul_precision("float32")
  def epoch(carry, k, xs, ys):
    p, s = carry
    order = jax.random.permutation(k, len(x))[:steps * b].reshape(steps, b)

    def step(c, idx):
      p, s = c
      g = jax.grad(lambda q: jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
          model.apply(q, xs[idx]), ys[idx])))(p)
      u, s = opt.update(g, s, p)
      return (optax.apply_updates(p, u), s), None
    return jax.lax.scan(step, (p, s), order)[0]
  xs, ys = jnp.asarray(x), jnp.asarray(y)
  carry = (params, opt.init(params))
  for e in range(epochs):
    carry = epoch(carry, jax.random.fold_in(key, e + 1), xs, ys)
  return carry[0]


def attack_features(apply_fn, params, x: np.ndarray, y: np.ndarray) -> np.ndarray:
  """[n, 3] what Shokri et al.'s attack model reads, label-aware: the loss on the
  true label, the largest predicted probability, the prediction's entropy."""
  @jax.jit
  @jax.default_matmul_precision("float32")
  def feats(xb, yb):
    logits = apply_fn(params, xb)
    logp = jax.nn.log_softmax(logits)
    p = jnp.exp(logp)
    loss = -jnp.take_along_axis(logp, yb[:, None], axis=1)[:, 0]
    return jnp.stack([loss, jnp.max(p, 1), -jnp.sum(p * logp, 1)], axis=1)
  return np.concatenate([np.asarray(feats(jnp.asarray(x[i:i + 1000]), jnp.asarray(y[i:i + 1000])))
                         for i in range(0, len(x), 1000)])


def shadow_attack(model, params, x_train, y_train, x_test, y_test, *, shadows: int = 4,
                  epochs: int, batch: int, lr: float, momentum: float,
                  examples: int | None = None, seed: int = 0) -> dict:
  """Shokri et al. 2017's attack: `shadows` models trained on halves of a shadow
  pool (the training examples not in the evaluated member set: same distribution,
  in or out of each shadow known), a logistic-regression attack model fitted on
  their in / out features (`attack_features`), then applied to the target's
  balanced member / non-member set. Its accuracy is at the attack model's own
  threshold (0.5), fitted without the target's membership labels; AUC and TPR at
  1 % FPR as `roc_figures`."""
  from sklearn.linear_model import LogisticRegression
  mem, non = balanced_sets(len(x_train), len(x_test), examples, seed)
  pool = np.setdiff1d(np.arange(len(x_train)), mem)
  if len(pool) < 20:
    raise ValueError(f"a shadow pool of {len(pool)} examples: the training split has too few "
                     "beyond the evaluated members (pass fewer examples)")
  rng = np.random.default_rng([seed, 1])
  feats, labels = [], []
  for s in range(shadows):
    inside = rng.random(len(pool)) < 0.5
    shadow = train_shadow(model, x_train[pool[inside]], y_train[pool[inside]], epochs=epochs,
                          batch=batch, lr=lr, momentum=momentum, seed=seed * 1000 + s + 1)
    feats.append(attack_features(model.apply, shadow, x_train[pool], y_train[pool]))
    labels.append(inside)
  X, Y = np.concatenate(feats), np.concatenate(labels)
  scale = X.std(0) + 1e-12
  clf = LogisticRegression(max_iter=1000).fit(X / scale, Y)
  score = lambda x, y: clf.decision_function(attack_features(model.apply, params, x, y) / scale)
  s_in, s_out = score(x_train[mem], y_train[mem]), score(x_test[non], y_test[non])
  figures = roc_figures(s_in, s_out)
  return {"attack": "shadow_model", "shadows": shadows, "shadow_epochs": epochs,
          "members": int(len(mem)), "nonmembers": int(len(non)),
          "accuracy_at_attack_threshold": float(((s_in > 0).mean() + (s_out <= 0).mean()) / 2),
          "best_threshold_accuracy": figures["accuracy"], "auc": figures["auc"],
          "tpr_at_1pct_fpr": figures["tpr_at_1pct_fpr"],
          "shadow_fit_accuracy": float(clf.score(X / scale, Y))}
