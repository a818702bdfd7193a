"""The named recipes: each algorithm composed from its stages, as optax.adam is
chain(scale_by_adam, scale_by_learning_rate).

Defaults are the Config's, so `recipes.fedprox()` is the run `algorithm: fedprox`
gives, and `recipes.X(...).to_config(**setup)` is the config.json of the run.
Notation: w^t the server model, delta_i = w_i - w^t client i's update after local
training, g = -sum_i n_i delta_i / sum_i n_i the pseudo-gradient, C a clip norm,
z a noise multiplier.
"""

from __future__ import annotations

from fedjax_dp.privacy import mechanisms
from fedjax_dp.recipes import stages as st
from fedjax_dp.recipes.base import Recipe, compose


def fedavg(server_lr: float = 1.0) -> Recipe:
  """FedAvg (McMahan et al. 2017): w^{t+1} = w^t - server_lr g (server_lr 1: the
  example-weighted mean of the clients' models)."""
  return compose("fedavg", st.sgd(server_lr))


def fedavgm(server_lr: float = 1.0, server_momentum: float = 0.9) -> Recipe:
  """FedAvgM (Hsu et al. 2019): server heavy-ball momentum on g,
  v <- beta v + g, w <- w - server_lr v."""
  return compose("fedavgm", st.momentum(server_lr, server_momentum), algorithm="fedavgm")


def fedadam(server_lr: float = 1.0, b1: float = 0.9, b2: float = 0.99,
            eps: float = 1e-3) -> Recipe:
  """FedAdam (Reddi et al. 2021): Adam on g at the server (optax's, with bias
  correction; the paper's has none). Reddi et al. tune server_lr over 10^[-3, 0]."""
  return compose("fedadam", st.adam(server_lr, b1, b2, eps), algorithm="fedadam")


def fedprox(mu: float = 0.001, server_lr: float = 1.0) -> Recipe:
  """FedProx (Li et al. 2020): each client adds mu/2 ||w - w^t||^2 to its loss."""
  return compose("fedprox", st.term("fedprox", prox_mu=mu), st.sgd(server_lr))


def scaffold(server_lr: float = 1.0) -> Recipe:
  """SCAFFOLD option II (Karimireddy et al. 2020): the local step uses
  g_i - c_i + c; c_i <- c_i - c + (w^t - w_i) / (K lr); c <- c + (1/N) sum (c_i' - c_i).
  Its control variates are not privatized: refused with DP and kept noise."""
  return compose("scaffold", st.term("scaffold"), st.sgd(server_lr))


def moon(mu: float = 1.0, tau: float = 0.5, server_lr: float = 1.0) -> Recipe:
  """MOON (Li, He, Song 2021): mu times the contrastive loss of the representation
  z against the global model's (positive) and the client's previous one's
  (negative), temperature tau."""
  return compose("moon", st.term("moon", moon_mu=mu, moon_tau=tau), st.sgd(server_lr))


def fedadmm(rho: float = 0.01, server_lr: float = 1.0, upload: str = "augmented") -> Recipe:
  """FedADMM (Gong, Li, Freris 2022): the client adds <y_i, w - w^t> + rho/2
  ||w - w^t||^2, updates y_i <- y_i + rho delta_i and uploads delta_i + y_i / rho
  (upload 'augmented') or 2 delta_i, its augmented model's change ('change', the
  authors' code; algorithms/fedadmm.py)."""
  return compose("fedadmm", st.term("fedadmm", admm_rho=rho, admm_upload=upload),
                 st.sgd(server_lr))


def feddyn(alpha: float = 0.01, server_lr: float = 1.0) -> Recipe:
  """FedDyn (Acar et al. 2021): the client adds -<g_i, w> + alpha/2 ||w - w^t||^2;
  the server keeps h and steps to mean_i w_i - h / alpha."""
  return compose("feddyn", st.term("feddyn", feddyn_alpha=alpha), st.sgd(server_lr))


def solo() -> Recipe:
  """SOLO: every client trains its own model from its last one, never aggregated
  (the baseline without federation). Refused with DP and kept noise."""
  return compose("solo", st.term("solo"), st.sgd(1.0))


def _contrastive_keys(mu1, mu2, radius, tau, form) -> dict:
  return dict(contrastive_mu1=mu1, contrastive_mu2=mu2, contrastive_radius=radius,
              contrastive_tau=tau, contrastive_form=form)


def contrastive(mu1: float = 0.01, mu2: float = 0.005, radius: float = 1.0, tau: float = 0.5,
                form: str = "bounded", server_lr: float = 1.0) -> Recipe:
  """TopkSDP-FL's contrastive term alone (our reading of the paper's lost equations):
  'bounded' adds mu1/2 ||w - w^t||^2 - mu2/2 min(||w - w_prev||^2, radius^2);
  'moon_params' mu1 times the contrastive loss of cos(w, w^t) against
  cos(w, w_prev) at temperature tau (w_prev: the client's previous local model)."""
  return compose("contrastive", st.term("contrastive",
                                        **_contrastive_keys(mu1, mu2, radius, tau, form)),
                 st.sgd(server_lr))


def topksdp(s_local: float = 0.9, s_global: float = 0.9, mu1: float = 0.01, mu2: float = 0.005,
            radius: float = 1.0, tau: float = 0.5, form: str = "bounded",
            shuffle: bool = True, server_lr: float = 1.0, **upload_keys) -> Recipe:
  """TopkSDP-FL: the contrastive term, top-k of (update + residual) with error
  feedback at sparsity s_local (k = (1 - s) d sent), the layer-wise shuffler,
  and downlink top-k at s_global. `upload_keys`: the pipeline's other config keys
  (index_selection, error_feedback, topk_kernel, coordinate_clip,
  update_clip_l2, final_clip_l2, kept_noise ('paper' or 'multiplier'),
  kept_noise_multiplier, kept_noise_draw, ldp_epsilon, ldp_delta)."""
  # (topk_kernel is the downlink's too: the uploads read it only with s_local > 0)
  uploads = {k: v for k, v in upload_keys.items() if k != "topk_kernel" or s_local > 0}
  parts = [st.term("contrastive", **_contrastive_keys(mu1, mu2, radius, tau, form)),
           st.sgd(server_lr), *st.upload(s_local=s_local, **uploads)]
  if s_global > 0:   # (the server stages in from_config's order)
    parts.append(st.downlink_topk(s_global, upload_keys.get("topk_kernel", "exact")))
  if upload_keys.get("index_selection") == "public_topk":
    parts.append(st.public_update())
  if shuffle:
    parts.append(st.shuffle("layerwise"))
  return compose("topksdp", *parts, algorithm="topksdp")


def dp_fedavg(noise_multiplier: float | None = 1.0, clip_norm: float = 1.0,
              target_epsilon: float | None = None, delta: float = 1e-5,
              accountant: str = "rdp", clip_parts: str = "flat",
              adaptive_clipping: bool = False, target_quantile: float = 0.5,
              clip_lr: float = 0.2, server_lr: float = 1.0) -> Recipe:
  """DP-FedAvg with central DP (McMahan et al. 2018): each update clipped to C,
  the server adds N(0, (z C)^2) to the sum and divides by the expected cohort;
  target_epsilon calibrates z (noise_multiplier None) or stops the run at the
  budget. adaptive_clipping: C follows the target_quantile of the update norms
  (Andrew et al. 2021)."""
  parts = [st.sgd(server_lr),
           st.central_dp(noise_multiplier=noise_multiplier, clip_norm=clip_norm,
                         target_epsilon=target_epsilon, delta=delta, accountant=accountant,
                         clip_parts=clip_parts),
           st.noise_schedule("static")]
  if adaptive_clipping:
    parts.append(st.adaptive_clipping(target_quantile=target_quantile, clip_lr=clip_lr))
  return compose("dp_fedavg", *parts)


def ldp_fedavg(noise_multiplier: float = 1.0, clip_norm: float = 1.0,
               target_epsilon: float | None = None, delta: float = 1e-5,
               accountant: str = "rdp", clip_parts: str = "flat", aggregator: str = "mean",
               server_lr: float = 1.0, **aggregator_keys) -> Recipe:
  """FedAvg with local DP: each client clips its update to C and adds N(0, (z C)^2)
  itself, so the server (and any robust `aggregator`, post-processing here) sees
  only noised uploads; each client's own ledger stops it at target_epsilon."""
  return compose("ldp_fedavg", st.sgd(server_lr),
                 st.local_dp(noise_multiplier=noise_multiplier, clip_norm=clip_norm,
                             target_epsilon=target_epsilon, delta=delta, accountant=accountant,
                             clip_parts=clip_parts),
                 st.noise_schedule("static"), st.aggregator(aggregator, **aggregator_keys))


def dynamic_dp(noise_multiplier: float | None = None, target_epsilon: float | None = 2.0,
               clip_norm: float = 0.1, delta: float = 1e-5, tier_source: str = "analyzer",
               analyzer_rule: str = "semantic", rest_tier: str = "medium",
               tier_noise_multipliers: tuple[float, ...] = (2.0, 1.0, 0.5, 0.25, 0.1),
               measure: str = "norm_diff", convergence_lambda: float = 0.1,
               convergence_window: int = 10, convergence_beta: float = 0.3,
               noise_ema: float = 0.9, server_lr: float = 1.0) -> Recipe:
  """Sensitivity-aware dynamic DP (the dynamic-DP paper, README): central DP whose
  clip and noise are per sensitivity tier of the features (clip_parts 'tiers',
  tiers from the semantic/statistical analyzer), and whose noise follows the
  convergence of the released updates: tier p's multiplier z m_p (1 - beta c_t),
  c_t in [0, 1] the convergence score (noise_control.py). Needs data with tiers
  (dataset healthcare, or csv or breast_cancer with tier_map_path)."""
  return compose(
      "dynamic_dp", st.sgd(server_lr),
      st.central_dp(noise_multiplier=noise_multiplier, target_epsilon=target_epsilon,
                    clip_norm=clip_norm, delta=delta, clip_parts="tiers",
                    tier_source=tier_source, analyzer_rule=analyzer_rule, rest_tier=rest_tier,
                    tier_noise_multipliers=tuple(tier_noise_multipliers)),
      st.noise_schedule("convergence", convergence_measure=measure,
                        convergence_lambda=convergence_lambda,
                        convergence_window=convergence_window,
                        convergence_beta=convergence_beta, noise_ema=noise_ema))


def dp_ftrl(strategy: str = "bandmf", noise_multiplier: float | None = 1.0,
            clip_norm: float = 1.0, target_epsilon: float | None = None, delta: float = 1e-5,
            mf_bands: int | None = None, server_lr: float = 1.0) -> Recipe:
  """DP-FTRL with correlated noise (Kairouz et al. 2021; BandMF, Choquette-Choo et al.
  2023; BLT, Dvijotham et al. 2024): `strategy` 'tree', 'bandmf' or 'blt'; each
  update clipped to C by the server, the sum noised with z sens C (C^-1 xi)_t, the
  run one Gaussian of multiplier z under the participation the sampler enforces
  (run it with sampling='cyclic' for a schedule; mf_bands: BandMF's bands)."""
  reads = mechanisms.get_mechanism(strategy).reads
  keys = {"mf_bands": mf_bands} if "mf_bands" in reads else {}
  return compose("dp_ftrl", st.sgd(server_lr),
                 st.correlated_dp(strategy, noise_multiplier=noise_multiplier,
                                  clip_norm=clip_norm, target_epsilon=target_epsilon,
                                  delta=delta, **keys),
                 st.noise_schedule("static"))


NAMED = {f.__name__: f for f in (fedavg, fedavgm, fedadam, fedprox, scaffold, moon, fedadmm,
                                 feddyn, contrastive, topksdp, solo, dp_fedavg, ldp_fedavg,
                                 dynamic_dp, dp_ftrl)}
