"""Every config key, declared once: its name, default, one-line meaning, allowed
values (choices, bounds, null), a limit that involves another key, and its
section. Config, the checks, `fedjax-dp config` and the docs' key table are all
derived from these rows (config/schema.py), so a key is spelled here and where a
stage reads it. The sections are listed in the reference's order.
"""

from fedjax_dp.config.key import Key, section

DATA = section("data", [
    Key("dataset", "digits", "the data (docs: Datasets); custom: your own, given to fedjax_dp.run",
        choices=()),
    Key("data_dir", None, "folder searched first for dataset files; null: the usual places",
        nullable=str),
    Key("csv_path", None, "the CSV file", nullable=str),
    Key("tier_map_path", None,
        "a feature,tier CSV or a JSON object: each column's sensitivity tier",
        nullable=str),
    Key("label_column", "label", "the label's column"),
    Key("synthetic_examples", 10000, "examples drawn", at_least=10),
    Key("synthetic_features", 32, "features per example", at_least=1),
    Key("synthetic_classes", 10, "classes", at_least=2),
    Key("healthcare_examples", 5000, "patients drawn by the generator", at_least=10),
    Key("healthcare_generator", "logits",
        "logits: classes from noisy logits of a few features (hard to learn); severity: a latent "
        "disease severity the clinical and imaging markers measure (an MLP learns it to ~96 %)",
        choices=("logits", "severity")),
    Key("feature_scaling", "auto",
        "how tabular features are standardised; auto: pooled without DP, per_client under DP",
        choices=("auto", "pooled", "per_client", "none")),
    Key("test_clients", 0,
        "a dataset's own clients held out whole as the test set (partition natural_id); 0: its "
        "file's test split, which holds the trained clients' examples (refused under DP)",
        at_least=0),
])

FEDERATION = section("federation", [
    Key("num_clients", 20, "clients in the population", at_least=1),
    Key("clients_per_round", 10, "cohort size (Poisson sampling: the expected size)",
        at_least=1, limit="<= num_clients"),
    Key("sampling", "fixed",
        "fixed: uniform without replacement; poisson: each client with q = clients_per_round / "
        "num_clients; cyclic: the clients split once into b = num_clients / clients_per_round "
        "groups, round t trains group t mod b; cyclic_poisson: min_separation groups, round t "
        "draws each client of group t mod min_separation with q = clients_per_round "
        "min_separation / num_clients; balls_in_bins: each client in a secret random bin of "
        "num_clients / clients_per_round, round t trains bin t mod bins; min_sep: each client "
        "who sat out the last min_separation - 1 rounds is drawn with the probability that "
        "makes clients_per_round the steady cohort (docs: Correlated noise)",
        choices=("fixed", "poisson", "cyclic", "cyclic_poisson", "balls_in_bins", "min_sep")),
    Key("min_separation", None,
        "sampling cyclic_poisson: its groups (a client's group trains every min_separation "
        "rounds); min_sep: the rounds a client waits between participations",
        at_least=1, nullable=int, limit="<= num_clients / clients_per_round"),
    Key("max_cohort", None,
        "random cohorts' capacity (overflow counted in summary.json); null: mean + 4 sd",
        at_least=1, nullable=int, limit=">= clients_per_round"),
    # choices: data/partition.py's PARTITIONS (config/ imports nothing of the package;
    # tests/test_flwr_partitions.py checks that each of them is here)
    Key("partition", "dirichlet", "how examples are split over clients",
        choices=("iid", "dirichlet", "shards", "quantity", "dirichlet_client", "natural_id",
                 "flwr_dirichlet", "inner_dirichlet", "pathological", "shard", "linear",
                 "square", "exponential")),
    Key("alpha", 0.5, "Dirichlet concentration of the label skew (smaller: more skew)", above=0),
    Key("classes_per_client", 2, "classes per client", at_least=1),
    Key("quantity_alpha", 1.0, "Dirichlet concentration over client sizes", above=0),
    Key("min_partition_size", 10, "the label split is redrawn (11 draws in all) until every "
        "client has this many examples", at_least=1),
    Key("self_balancing", False, "a client already above the mean size takes none of the "
        "classes still to split"),
    Key("client_sizes", None, "each client's examples; null: near-equal sizes",
        nullable=tuple, allowed="a list of num_clients integers >= 1 summing to the training "
        "set's size"),
    Key("class_assignment", "random", "a client's classes: random; deterministic: i, i + 1, "
        "... mod the classes (client i); first_deterministic: i mod the classes, the rest random",
        choices=("random", "deterministic", "first_deterministic")),
    Key("shards_per_client", 2, "shards per client; null: the shard_size shards dealt evenly, "
        "the first clients one more", at_least=1, nullable=int),
    Key("shard_size", None, "examples per shard; null: the training set's size over "
        "num_clients x shards_per_client, rounded down", at_least=1, nullable=int),
    Key("keep_incomplete_shard", False, "the last, short shard is a shard too (docs: "
        "Datasets)"),
])

MODEL = section("model", [
    Key("model", "mlp",
        "mlp with `hidden` layers; cnn: 2 conv + 2 dense (hidden[0] = dense width); leaf_cnn: "
        "LEAF's FEMNIST CNN (dense 2048); resnet18: ResNet-18 with GroupNorm; char_lstm: "
        "Shakespeare's 2-layer character LSTM (the next character of 80: LEAF's shakespeare); "
        "char_lstm_seq: the same LSTM predicting every position (shakespeare_tff); word_lstm: "
        "Stack Overflow's next-word LSTM (stackoverflow); simple_cnn: pfl-research's CIFAR-10 "
        "CNN (FedJAX's EMNIST CNN); custom: your own, given to fedjax_dp.run",
        choices=("mlp", "cnn", "leaf_cnn", "resnet18", "char_lstm", "char_lstm_seq",
                 "word_lstm", "simple_cnn", "custom")),
    Key("hidden", (200, 200), "hidden layer sizes"),
])

LOCAL_TRAINING = section("local training", [
    # the defaults train the default data, digits, to ~95 % in 50 rounds
    Key("local_epochs", 2, "local epochs E per round", at_least=1),
    Key("batch_size", 16, "local minibatch size (an epoch's last batch may be short)", at_least=1),
    Key("lr", 0.05, "client learning rate", above=0, data=True),
    Key("lr_schedule", "constant", "constant, or cosine annealing over `rounds` to lr_min",
        choices=("constant", "cosine")),
    Key("lr_min", 0.0, "the cosine schedule's final learning rate", at_least=0, limit="<= lr",
        data=True),
    Key("momentum", 0.5, "client SGD momentum", at_least=0, below=1, data=True),
])

ALGORITHM_AND_SERVER = section("algorithm and server", [
    Key("algorithm", "fedavg",
        "the federated algorithm, or a +-joined combination of local terms (docs: Algorithms)",
        feeds=("term:*",)),
    Key("server_optimizer", "auto", "auto: momentum for fedavgm, adam for fedadam, else sgd",
        choices=("auto", "sgd", "momentum", "adam"), feeds=("server_optimizer:*",)),
    Key("server_lr", 1.0, "server learning rate", above=0, feeds=("server_optimizer:*",),
        data=True),
    Key("server_lr_schedule", "constant",
        "the server learning rate by round: constant, or cosine decay over `rounds` to "
        "server_lr_min (dp bandmf optimises its strategy for that workload)",
        choices=("constant", "cosine"), feeds=("server_optimizer:*",)),
    Key("server_lr_min", 0.0, "the server's cosine schedule's final learning rate", at_least=0,
        limit="<= server_lr", feeds=("server_optimizer:*",), data=True),
    Key("server_momentum", 0.9, "the momentum server optimizer's momentum", at_least=0, below=1,
        feeds=("server_optimizer:*",), data=True),
    Key("server_beta1", 0.9, "the adam server optimizer's beta1", at_least=0, below=1,
        feeds=("server_optimizer:*",)),
    Key("server_beta2", 0.99, "the adam server optimizer's beta2", at_least=0, below=1,
        feeds=("server_optimizer:*",)),
    Key("server_eps", 0.001, "the adam server optimizer's epsilon", above=0,
        feeds=("server_optimizer:*",)),
    Key("prox_mu", 0.001, "FedProx's proximal weight", at_least=0,
        feeds=("term:fedprox.mu",)),
    Key("contrastive_form", "bounded",
        "TopkSDP-FL's contrastive term: bounded (the paper's) or moon_params",
        choices=("bounded", "moon_params"), feeds=("term:contrastive.form",)),
    Key("contrastive_mu1", 0.01, "weight of the pull towards the global model", at_least=0,
        feeds=("term:contrastive.mu1",)),
    Key("contrastive_mu2", 0.005, "weight of the push from the previous model", at_least=0,
        feeds=("term:contrastive.mu2",)),
    Key("contrastive_radius", 1.0, "the bounded form's push radius", above=0,
        feeds=("term:contrastive.radius",)),
    Key("contrastive_tau", 0.5, "the moon_params form's temperature", above=0,
        feeds=("term:contrastive.tau",)),
    Key("moon_mu", 1.0, "MOON's contrastive weight", at_least=0,
        feeds=("term:moon.mu",)),
    Key("moon_tau", 0.5, "MOON's temperature", above=0,
        feeds=("term:moon.tau",)),
    Key("admm_rho", 0.01, "FedADMM's penalty", above=0,
        feeds=("term:fedadmm.rho",)),
    Key("admm_upload", "augmented",
        "what a FedADMM client uploads: augmented (delta + y_i / rho: its augmented model less "
        "w^t) or change (delta + the dual's change / rho = 2 delta: the authors' code)",
        choices=("augmented", "change"), feeds=("term:fedadmm.upload",)),
    Key("feddyn_alpha", 0.01, "FedDyn's regulariser weight", above=0,
        feeds=("term:feddyn.alpha",)),
])

UPDATE_PIPELINE = section("update pipeline (top-k, kept noise, shuffling)", [
    Key("s_local", 0.0, "upload sparsity: fraction of coordinates each client drops (0: dense)",
        at_least=0, below=1, feeds=("upload:topk.sparsity",)),
    Key("s_global", 0.0, "broadcast sparsity: fraction of the global update's coordinates dropped",
        at_least=0, below=1, feeds=("server:downlink_topk.sparsity",)),
    Key("index_selection", "topk",
        "which coordinates an upload keeps: largest, random, or public top-k",
        choices=("topk", "random_k", "public_topk"),
        feeds=("upload:topk.selection", "server:public_update")),
    Key("topk_kernel", "exact",
        "how the top-k is found: exact sort, approx, threshold or bisection",
        choices=("exact", "approx", "threshold", "bisect"),
        feeds=("upload:topk.kernel", "server:downlink_topk.kernel")),
    Key("error_feedback", True, "carry each client's dropped coordinates into its next upload",
        feeds=("upload:topk.error_feedback",)),
    Key("coordinate_clip", None, "clip each upload coordinate to [-c, c]; null: no clip",
        above=0, nullable=float, feeds=("upload:clip_per_coordinate.clip",), data=True),
    Key("update_clip_l2", None, "clip each upload to this L2 norm before top-k; null: no clip",
        above=0, nullable=float, feeds=("upload:clip_l2.clip",), data=True),
    Key("final_clip_l2", None, "clip the sent (sparse) upload to this L2 norm; null: no clip",
        above=0, nullable=float, feeds=("upload:topk.final_clip", "upload:clip_sent.clip"),
        data=True),
    # choices=(): 'none' or a calibration's name (privacy.mechanisms.KEPT_NOISE), checked at
    # the edge
    Key("kept_noise", "none",
        "Gaussian noise on the kept coordinates: the paper's calibration, or a multiplier",
        choices=(), feeds=("upload:gaussian_on_kept",)),
    Key("kept_noise_multiplier", 0.0, "kept_noise multiplier: the noise std over the clip",
        at_least=0, feeds=("upload:gaussian_on_kept",), data=True),
    Key("kept_noise_draw", "auto",
        "who draws kept noise: each client, or one draw for the aggregate; auto picks",
        choices=("auto", "client", "aggregate"), feeds=("upload:gaussian_on_kept",)),
    Key("ldp_epsilon", None,
        "kept_noise paper: per-round client epsilon of the paper's calibration",
        above=0, nullable=float, feeds=("upload:gaussian_on_kept",)),
    Key("ldp_delta", 1e-05, "delta of the per-round client guarantee",
        above=0, below=1, limit="< 1 / num_clients with kept noise",
        feeds=("upload:gaussian_on_kept",)),
    Key("shuffle", "none", "layerwise: the shuffler permutes uploads per layer (TopkSDP-FL)",
        choices=("none", "layerwise"), feeds=("shuffle:*",)),
])

AGGREGATION = section("aggregation and Byzantine clients", [
    # choices=(): a registry's names (robust.AGGREGATORS), checked at the edge
    Key("aggregator", "mean", "the server's aggregation rule (docs: Attacks and defenses)", choices=(),
        feeds=("aggregator:*",)),
    Key("trim_fraction", 0.1, "fraction trimmed at each end", at_least=0, below=0.5,
        feeds=("aggregator:trimmed_mean.beta",)),
    Key("byzantine_f", 0, "the number of Byzantine clients assumed", at_least=0,
        feeds=("aggregator:krum.f", "aggregator:multi_krum.f")),
    Key("multi_krum_m", 0, "updates averaged (0: cohort - f)", at_least=0,
        feeds=("aggregator:multi_krum.m",)),
    Key("outlier_z", 3.5,
        "robust z-score above which an update is an outlier (outlier_median: of its distance to "
        "the median; filtered_mean: of its norm)",
        above=0, feeds=("aggregator:outlier_median.z", "aggregator:filtered_mean.z")),
    Key("filter_cosine", 0.0,
        "filtered_mean: an update whose cosine with the coordinate-wise median is below this is "
        "dropped",
        at_least=-1, at_most=1, feeds=("aggregator:filtered_mean.cos_min",)),
    Key("cluster_threshold", 0.5, "cosine similarity that joins two updates", at_least=-1, below=1,
        feeds=("aggregator:cluster.threshold",)),
    Key("cluster_noise", "uniform",
        "cluster with local DP: equalize gives each cluster a median cluster's noise",
        choices=("uniform", "equalize"), feeds=("aggregator:cluster.noise",)),
    Key("geomed_iters", 4, "Weiszfeld steps after the weighted mean", at_least=0,
        feeds=("aggregator:geometric_median.iters",)),
    Key("geomed_eps", 1e-06, "smoothing of the distances", above=0,
        feeds=("aggregator:geometric_median.eps",)),
    Key("cclip_tau", 1.0, "clipping radius", above=0,
        feeds=("aggregator:centered_clip.tau",)),
    Key("cclip_iters", 1, "clipping steps per round", at_least=1,
        feeds=("aggregator:centered_clip.iters",)),
    Key("byzantine_fraction", 0.0,
        "fraction of clients that are Byzantine (floor of fraction x num_clients)",
        at_least=0, below=1),
    Key("byzantine_attack", "sign_flip",
        "what Byzantine clients send (alie, ipm: colluding, from the round's honest uploads; see "
        "Robust aggregation and Byzantine clients)",
        choices=("sign_flip", "scaled", "gaussian", "alie", "ipm", "label_flip", "targeted",
                 "backdoor")),
    Key("byzantine_scale", 10.0,
        "the attack's scale (sign_flip, scaled, ipm: factor; gaussian: std; backdoor: the "
        "upload's boost, model replacement; 1: none)",
        at_least=0),
    Key("byzantine_draw", "fixed",
        "which clients are Byzantine: fixed (drawn once from data_seed) or round (drawn afresh "
        "each round)",
        choices=("fixed", "round")),
    Key("attack_source_class", 1, "targeted poisoning: the class the malicious clients relabel",
        at_least=0),
    Key("attack_target_class", 0, "targeted poisoning and backdoor: the class they relabel to",
        at_least=0),
    Key("backdoor_fraction", 0.5,
        "backdoor: the share of a malicious client's examples that carry the trigger",
        above=0, at_most=1),
    Key("server_clip_l2", None,
        "norm bounding: the server clips every upload it receives to this L2 norm before the "
        "aggregation rule; null: off",
        above=0, nullable=float),
])

DIFFERENTIAL_PRIVACY = section("differential privacy", [
    Key("dp", "none",
        "central: the server noises the clipped sum; local: each client noises its own update; "
        "tree, bandmf, blt: the server's noise correlated across rounds (DP-FTRL; docs: "
        "Private training, Correlated noise)",
        choices=(), feeds=("privacy:*",)),
    Key("mf_bands", None,
        "dp bandmf: the strategy's bands (at most the sampler's separation of a client's "
        "rounds); null: that separation, at most 32 and the rounds",
        at_least=1, nullable=int, feeds=("privacy:*",)),
    Key("clip_norm", 1.0, "L2 clip of each client's update (adaptive clipping: the initial norm)",
        above=0, feeds=("privacy:*",), data=True),
    Key("noise_multiplier", None, "noise std / clip_norm; null: calibrated to target_epsilon",
        at_least=0, nullable=float, allowed="0, or >= 1e-6 (below it the accountant overflows)",
        feeds=("privacy:*",), data=True),
    Key("target_epsilon", None,
        "the privacy budget: calibrates the noise, or stops the run before passing it",
        above=0, nullable=float, feeds=("privacy:*",), data=True),
    Key("delta", 1e-05, "the guarantee's delta",
        above=0, below=1, limit="< 1 / num_clients under dp", feeds=("privacy:*",), data=True),
    Key("accountant", "rdp", "rdp; pld adds dp-accounting's tighter PLD figure",
        choices=("rdp", "pld"), feeds=("privacy:*",)),
    Key("local_noise_draw", "auto",
        "dp local: each client draws its report's noise, or the cohort's sum of them is drawn "
        "at once (aggregate: the same distribution, other bits; only where nothing reads a "
        "single report); auto: aggregate where it can",
        choices=("auto", "client", "aggregate")),
    Key("clip_parts", "flat", "clip the update whole, per layer, or per sensitivity tier",
        choices=("flat", "per_layer", "tiers"), feeds=("privacy:*",)),
    Key("rest_tier", "medium", "tier of the parameters outside the first layer's rows",
        choices=("high", "medium", "low", "public", "metadata"), feeds=("privacy:*",)),
    Key("tier_noise_multipliers", (2.0, 1.0, 0.5, 0.25, 0.1),
        "noise factors of high, medium, low, public, metadata", feeds=("privacy:*",), data=True),
    Key("adaptive_clipping", False,
        "move clip_norm towards a quantile of the update norms (central DP; tree, bandmf, blt)",
        feeds=("adaptive_clip:*",)),
    Key("target_quantile", 0.5, "the quantile of update norms aimed at", at_least=0, at_most=1,
        feeds=("adaptive_clip:*",), data=True),
    Key("clip_lr", 0.2, "the geometric step of the clip norm", above=0, feeds=("adaptive_clip:*",),
        data=True),
    Key("clip_count_stddev", None,
        "std of the unclipped count's noise; null: m/20, raised for small cohorts (tree, "
        "bandmf, blt: to z sqrt(k) for a client's k participations)",
        above=0, nullable=float, feeds=("adaptive_clip:*",), data=True),
    Key("audit_canaries", 0,
        "clients whose upload is a fixed random direction of norm clip_norm, for an empirical "
        "privacy audit (fedjax-dp audit)",
        at_least=0),
    Key("audit_canary_scale", 1.0,
        "the canaries' uploads are this times clip_norm times their direction (0: they take no "
        "part; the multi-run audit's runs)",
        at_least=-1, at_most=1, data=True),
])

DYNAMIC_DP = section("dynamic DP (sensitivity tiers, adaptive noise, budgets)", [
    Key("tier_source", "given",
        "where feature tiers come from: the data's metadata, or the sensitivity analyzer",
        choices=("given", "analyzer"), feeds=("privacy:*",)),
    Key("analyzer_rule", "semantic",
        "which analyzer score sets the tiers: semantic (the most accurate), fused (the paper's), "
        "statistical",
        choices=("fused", "semantic", "statistical"), feeds=("privacy:*",)),
    Key("analyzer_steps", 1500, "training steps of the analyzer's semantic network", at_least=10,
        feeds=("privacy:*",)),
    Key("noise_schedule", "static",
        "static noise, or the convergence / weighted adaptive schedules",
        choices=("static", "convergence", "weighted"), feeds=("planner:*",)),
    Key("convergence_measure", "update_diff",
        "what the convergence score reads: update differences or norm differences",
        choices=("update_diff", "norm_diff"), feeds=("planner:*",)),
    Key("convergence_lambda", 0.1, "the convergence score's lambda", at_least=0,
        feeds=("planner:*",), data=True),
    Key("convergence_window", 10, "rounds in the convergence score's window", at_least=1,
        feeds=("planner:*",)),
    Key("convergence_beta", 0.3, "noise reduction at full convergence", at_least=0, below=1,
        feeds=("planner:*",), data=True),
    Key("noise_ema", 0.9, "EMA weight of the convergence score's controller", at_least=0, below=1,
        feeds=("planner:*",), data=True),
    Key("client_budgets", "uniform",
        "local DP with target_epsilon: uniform, or the paper's per-client allocation",
        choices=("uniform", "allocated"), feeds=("budgets:*",)),
])

RUN = section("run", [
    # round r's key is fold_in(run_key, r) and the model's initialisation key is
    # fold_in(run_key, 2^20) (core/state.MODEL_INIT): round 2^20 would reuse it
    Key("rounds", 50, "federated rounds", at_least=1, below=2**20),
    Key("eval_every", 5, "evaluation (and metrics line) period in rounds", at_least=1),
    Key("seed", 0,
        "model initialisation; with the release's settings and data, the run key: cohorts, local "
        "training, noise (and the data's, unless data_seed)",
        at_least=0, at_most=2**31 - 1),
    Key("data_seed", None,
        "the data's split, the partition, the Byzantine clients, the analyzer; null: seed (a "
        "sweep's seeds share it, so they differ only in the seed)",
        at_least=0, at_most=2**31 - 1, nullable=int),
    Key("noise_seed", "config",
        "secret: the run key comes from the operating system, never from seed",
        choices=("config", "secret")),
    Key("checkpoint_every", 0, "checkpoint period in rounds; 0: none", at_least=0),
    Key("keep_checkpoints", 3, "checkpoints kept", at_least=1),
    Key("eval_batch_size", 1000, "examples per evaluation batch", at_least=1),
    Key("plugins", (),
        "Python files (.py) or importable modules, imported before the config is checked: "
        "they register terms, rules, mechanisms and datasets (docs: Extend)"),
])

DEVICES = section("devices and memory", [
    Key("devices", 0, "devices in the clients mesh; 0: all", at_least=0),
    Key("client_parallelism", "auto",
        "how a device runs its clients: a loop (map), batched (vmap), one gradient step "
        "(one_step), or few small steps as low-rank updates of the shared model (low_rank); "
        "auto picks",
        choices=("auto", "map", "vmap", "one_step", "low_rank")),
    Key("client_batch", 0,
        "clients per group (map, vmap) or chunk (one_step); 0: the mode's default (docs: "
        "Cross-device scale)",
        at_least=0),
    Key("client_state_store", "device",
        "where per-client state lives: on the device, in host memory, or on disk",
        choices=("device", "host", "disk")),
    Key("client_state_dtype", "float32", "host or disk table's storage type for float leaves",
        choices=("float32", "bfloat16")),
    Key("client_state_dir", None, "disk table's folder; null: the system's temporary folder",
        nullable=str),
    Key("matmul_precision", "float32",
        "matrix products of training and evaluation: float32 (the CPU's numbers on any device), "
        "or tensorfloat32 (an NVIDIA GPU's tensor cores round the inputs to 10 bits: faster, ~1e-3 "
        "relative error; same as float32 on CPU). Aggregation is float32 either way",
        choices=("float32", "tensorfloat32")),
])

KEYS: tuple[Key, ...] = (DATA + FEDERATION + MODEL + LOCAL_TRAINING + ALGORITHM_AND_SERVER
                         + UPDATE_PIPELINE + AGGREGATION + DIFFERENTIAL_PRIVACY + DYNAMIC_DP
                         + RUN + DEVICES)
