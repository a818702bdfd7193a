"""The release registry's tables: every figure and file a run, sweep, audit, attack,
compare or profile can publish, declared once with its privacy status (releases.py
looks names up in them, lists what a run wrote and renders the README's table).

A published thing is named `file` or `file:key` (a dotted path into JSON, a column of a
table: 'metrics.jsonl:train_loss', 'summary.json:data.client_examples.min'). Its status:

  covered      inside the guarantee: the released models, and functions of them, of the
               configuration and of public data (the test set is no client's: data/
               own_data.py refuses a holdout of the clients' rows under a guarantee);
  public       the configuration, the code, the machine, or public data: it says
               nothing about any client;
  not covered  computed from the clients' data (their updates, sizes, losses, or the
               time their training takes) without noise, or a secret the guarantee rests
               on: the report's `not_accounted` lists it, with what it reveals.

The metrics rows' figures (FIGURES) are declared once and reused by every table that
carries them (metrics.jsonl, metrics.csv, TensorBoard, summary.json's `final`, a sweep's
results and final tables, compare's table). A status may depend on the run's config (a
robust rule's count is post-processing of noised reports under local DP, and not
covered under central DP). INFLUENCES are what the mechanism leaves uncovered whatever is
published (pooled standardisation, analyzer-chosen tiers, allocated budgets).
"""

from __future__ import annotations

from typing import Callable, NamedTuple
from fedjax_dp.privacy.mechanisms import get_mechanism, kept_noise

from fedjax_dp.stage import COVERED, NOT_COVERED, PUBLIC  # (a stage declares its metrics)
from fedjax_dp.recipes.flat import kept_noise_of
Status = str | Callable   # a status, or cfg -> status


class Declared(NamedTuple):
  """A release's declaration: its status (for this config) and one sentence: what it
  is (covered, public) or what it reveals (not covered)."""
  status: str
  says: str


# ------------------------------------------------------------------ conditions


def _reports_privatized(cfg) -> bool:
  """Every report is noised by its client before it leaves (local DP): what the
  server computes from the reports is then post-processing. Read from the
  mechanism's properties, not its accounting: per-client ledgers alone (a server
  that noises the sum while each client keeps its own epsilon) privatize no report."""
  m = get_mechanism(cfg.dp)
  return m.boundary == "client" and m.noises_each_upload


def _allocated(cfg) -> bool:
  return cfg.client_budgets == "allocated"


def _by_budgets(cfg) -> str:
  """Per-client budgets allocated from the clients' example counts decide who may
  take part, so what follows participation is not covered."""
  return NOT_COVERED if _allocated(cfg) else COVERED


def _post_processing_under_local(cfg) -> str:
  return COVERED if _reports_privatized(cfg) else NOT_COVERED


def _analyzer_tiers(cfg) -> str:
  return NOT_COVERED if cfg.tier_source == "analyzer" else PUBLIC


def _seeded(cfg) -> str:
  """With noise_seed 'config' the run key follows the seed (and the settings and data
  an adversary is assumed to know), so the seed is as secret as the noise."""
  return NOT_COVERED if cfg.noise_seed == "config" else PUBLIC


# ------------------------------------------------------------------ row figures

_TRAINING = "computed from the clients' data without noise"
_TIMING = ("wall-clock time: each client trains epochs x ceil(n_i / batch_size) steps, so "
           "the time follows the cohorts' example counts (and the realised cohort sizes)")

FIGURES: dict[str, tuple[Status, str]] = {
    "round": (PUBLIC, "the round counter"),
    "test_*": (COVERED, "the released model on the test set, which is no client's"),
    "attack_success_rate": (COVERED, "the released model on the attack's triggered test set"),
    "target_misclassification": (COVERED, "the released model on the test set's source class"),
    "train_loss": (NOT_COVERED, "the clients' local training loss, " + _TRAINING),
    "epsilon": (_by_budgets, "the accountant's figure: the configuration and what the rounds "
                             "released (with allocated budgets it follows the clients' example "
                             "counts)"),
    "delta": (PUBLIC, "the configured delta"),
    "epsilon_accountant": (PUBLIC, "which accountant gave epsilon"),
    "epsilon_why_none": (PUBLIC, "why there is no epsilon"),
    "clients_spent": (_by_budgets, "clients whose budget is spent: their participations (and, "
                                   "with allocated budgets, their example counts)"),
    "clip_norm": (COVERED, "the clip norm: configured, or moved by the noised and accounted "
                           "clipped count (adaptive clipping)"),
    "unclipped_fraction": (NOT_COVERED, "the share of uploads within the clip norm, " + _TRAINING
                                        + " (under Poisson central DP over the expected cohort, so it "
                                        "can exceed 1: the realised cohort is private)"),
    "nonfinite_uploads": (NOT_COVERED, "uploads with a NaN or inf, sent as zero, " + _TRAINING),
    "flagged": (_post_processing_under_local,
                "uploads a robust rule left out: from the uploads before any noise on their sum "
                "(under local DP post-processing of the noised reports)"),
    "clusters": (_post_processing_under_local,
                 "the cluster rule's clusters: from the uploads before any noise on their sum "
                 "(under local DP post-processing of the noised reports)"),
    "norm_bounded": (_post_processing_under_local,
                     "uploads the server's norm bound clipped: from the uploads before the "
                     "noise on their sum (under local DP post-processing of the noised reports)"),
    "bytes_up": (_by_budgets, "bytes the clients would send: expected cohorts under Poisson "
                              "central DP, else the realised ones, which follow the sampler "
                              "(and, with allocated budgets, the clients' example counts)"),
    "bytes_down": (_by_budgets, "bytes the server would send, as bytes_up"),
    "wall_s": (NOT_COVERED, _TIMING),
    "nonfinite": (NOT_COVERED, "which figures of the row were not finite, train_loss among "
                               "them"),
}


# ------------------------------------------------------------------ fields of files

_DIAG = "the run's diagnostics"
# summary.json, by dotted path ('*' one segment, '**' any rest); 'final.*' are FIGURES
SUMMARY: dict[str, tuple[Status, str]] = {
    "best_test_accuracy": (COVERED, "the released models on the test set"),
    "test_accuracy_is": (PUBLIC, "what test_accuracy measures"),
    "test_metrics_are": (PUBLIC, "what the test metrics measure"),
    "rounds": (PUBLIC, "the rounds run (a budget stop is the accountant's; a divergence's is "
                       "in diverged)"),
    "diverged": (NOT_COVERED, "where the training stopped being finite, read from the training "
                              "loss (" + _TRAINING + "); it also ends the run"),
    "diverged.**": (NOT_COVERED, "where the training stopped being finite, with the last finite "
                                 "row's train_loss, " + _TRAINING),
    "warnings": (NOT_COVERED, "texts that quote the unnoised training loss"),
    "plots": (PUBLIC, "the plots' paths"),
    "communication.bytes_*": (_by_budgets, "as the rows' bytes_up and bytes_down"),
    "communication.participations": (_by_budgets, "as the rows' bytes_up"),
    "communication.**": (PUBLIC, "the configuration and the model's size"),
    "timing.**": (NOT_COVERED, _TIMING),
    "model.**": (PUBLIC, "the model"),
    "data.dataset": (PUBLIC, "the configuration"),
    "data.name": (PUBLIC, "your data's name"),
    "data.source": (PUBLIC, "where the data was read from"),
    "data.feature_scaling": (PUBLIC, "the configuration"),
    "data.clients": (PUBLIC, "the population size (num_clients)"),
    "data.test_examples": (PUBLIC, "the size of the test set, which is public"),
    "data.train_examples": (NOT_COVERED, "the number of training examples, counted without noise"),
    "data.client_examples.*": (NOT_COVERED, "the smallest, median and largest client's example "
                                            "count, without noise"),
    "inputs.**": (NOT_COVERED, "names, sizes and SHA-256 digests of your training data: anyone "
                               "can confirm a guess of the whole dataset with them"),
    "devices.**": (PUBLIC, "the machine"),
    "cohort_overflow": (NOT_COVERED, "Poisson draws beyond max_cohort: a function of the "
                                     "realised cohort sizes"),
    "analyzer.rule": (PUBLIC, "the configuration"),
    "analyzer.fusion": (PUBLIC, "the analyzer's method"),
    "analyzer.semantic_training.**": (PUBLIC, "a network trained on public synthetic data"),
    "analyzer.time_share.paper": (PUBLIC, "a constant of the paper"),
    "analyzer.**": (NOT_COVERED, "the sensitivity analyzer's scores of every client's raw data, "
                                 "their memory and time, without noise"),
    # the privacy report
    "privacy.not_accounted": (PUBLIC, "this list"),
    "privacy.assumes": (PUBLIC, "what the guarantee takes for granted"),
    "privacy.client_budgets.method": (PUBLIC, "the allocation's method"),
    "privacy.client_budgets.sum": (PUBLIC, "num_clients x target_epsilon"),
    "privacy.client_budgets.**": (NOT_COVERED, "every client's budget, from its example count "
                                               "(and the analyzer's scores of its data)"),
    "privacy.clients.**": (_by_budgets, "the clients' epsilons and participations"),
    "privacy.tiers.**": (_analyzer_tiers, "per-tier clip norms and noise: the tier map (chosen "
                                          "by the analyzer from the clients' raw data, or "
                                          "given)"),
    "privacy.effective_noise_multiplier": (_analyzer_tiers, "the tiers' composed multiplier, "
                                                           "as privacy.tiers"),
    "privacy.**": (COVERED, "the accountant's figures: the configuration and what the rounds "
                            "released"),
}

# a run folder's files; the tables' columns and the JSON files' keys are looked up above
RUN_FILES: dict[str, tuple[Status, str]] = {
    "config.json": (_seeded, "the settings, with the seed: under noise_seed 'config' every "
                             "noise draw follows from it (and from settings and data an "
                             "adversary is assumed to know), so publish config.json without "
                             "its seed, or run with noise_seed 'secret'"),
    "model.msgpack": (COVERED, "the released model"),
    "released.json": (PUBLIC, "the last round any output came from"),
    "segments.jsonl": (PUBLIC, "which rounds and calibration each stretch of rounds ran under, "
                               "and the SHA-256 of each plugin's source as imported"),
    "checkpoints/": (NOT_COVERED, "the server's private working state: the run key, unnoised "
                                  "per-client state (residuals, control variates, local models, "
                                  "ledgers) and the unnoised diagnostics; never publish them"),
    "run_key.secret": (NOT_COVERED, "the run key: with it, the noise subtracts exactly from a "
                                    "released model; never publish it"),
    "inputs.json": (NOT_COVERED, "names, sizes and SHA-256 digests of your training data: "
                                 "anyone can confirm a guess of the whole dataset with them"),
    "metrics.jsonl": (PUBLIC, "the rows (their figures are declared one by one)"),
    "metrics.csv": (PUBLIC, "the rows as CSV (their figures are declared one by one)"),
    "tensorboard/": (PUBLIC, "the rows as TensorBoard scalars (declared one by one)"),
    "summary.json": (PUBLIC, "the summary (its fields are declared one by one)"),
    "client_epsilons.csv": (_by_budgets, "each local-DP client's epsilon and participations"),
    "audit.json": (COVERED, "the one-shot audit's estimate, lower bounds and attack rates: "
                            "the released model against public canary directions, and the "
                            "run's accounted epsilon"),
}
# a plot shows row figures: it is declared by them (worst status first)
PLOT_FIGURES = {"loss.png": ("test_loss", "train_loss"), "bytes.png": ("bytes_up", "bytes_down"),
                "epsilon.png": ("epsilon",),
                "attack.png": ("attack_success_rate", "target_misclassification",
                               "test_accuracy")}
# the sweep's, audit's, attack's, compare's and profile's own files
OTHER_FILES: dict[str, tuple[Status, str]] = {
    "sweep:experiment.json": (PUBLIC, "marks the folder as a sweep's"),
    "sweep:sweep.json": (PUBLIC, "the sweep file, its cells and outputs (keys declared one by one)"),
    "sweep:sweep.json:wall_s": (NOT_COVERED, _TIMING),
    "sweep:sweep.json:**": (_seeded, "the sweep file, its cells and outputs, with the cells' "
                                     "seeds (as config.json's seed)"),
    "sweep:cells/": (PUBLIC, "the cells' run folders, each declared as a run's"),
    "sweep:results.csv": (PUBLIC, "every cell's rows (columns declared one by one)"),
    "sweep:results.parquet": (PUBLIC, "every cell's rows (columns declared one by one)"),
    "sweep:final.csv": (PUBLIC, "each setting's last rows over seeds (columns declared one by one)"),
    "audit:audit.json": (_seeded, "the multi-run audit's estimate (its models against a public "
                                  "canary directions, covered) with its runs' seeds (as "
                                  "config.json's seed)"),
    "audit:audit.json:**": (_seeded, "the multi-run audit's figures (covered) and its runs' "
                                     "seeds (as config.json's seed)"),
    "audit:runs.csv": (_seeded, "each audit run's statistic of its model and its epsilon "
                                "(covered), with its seed (as config.json's seed)"),
    "audit:run/": (PUBLIC, "the audited run's folder, declared as a run's"),
    "attack:mia.json": (NOT_COVERED, "the attack's figures, computed from the training examples "
                                     "themselves (members) and shadow models trained without "
                                     "noise: an evaluation for the data holder, not a release"),
    "attack:attribute.json": (NOT_COVERED, "the attack's figures and candidate values, read from "
                                           "the training data's sensitive column: an evaluation "
                                           "for the data holder, not a release"),
    "compare:table.csv": (PUBLIC, "the compared runs' settings and figures (columns declared one "
                                  "by one)"),
    "compare:plot.png": (COVERED, "the compared runs' first test metric and epsilon"),
    "profile:profile.json": (NOT_COVERED, _TIMING),
    "profile:ops.csv": (NOT_COVERED, "every compiled operation's count and time: the steps "
                                     "follow the clients' example counts"),
    "profile:plugins/": (NOT_COVERED, "the trace's timestamps: " + _TIMING),
    "account:stdout": (PUBLIC, "the command line's numbers only"),
    "datasets:partition": (NOT_COVERED, "every client's label histogram, without noise"),
}

# sweep tables' and compare's own columns (besides the settings and the row figures)
TABLE_COLUMNS: dict[str, tuple[Status, str]] = {
    "cell": (PUBLIC, "the cell's name"), "setting": (PUBLIC, "the setting's name"),
    "run": (PUBLIC, "the run's folder"), "status": (PUBLIC, "finished, or where it stopped"),
    "guarantee": (PUBLIC, "the neighbouring relation the run's epsilon is for"),
    "seeds": (PUBLIC, "the seeds of a setting"), "round_min": (PUBLIC, "the last round all "
                                                                       "seeds reached"),
    "mb_up": (_by_budgets, "as bytes_up"), "mb_down": (_by_budgets, "as bytes_down"),
    "s_per_round": (NOT_COVERED, _TIMING),
}

# what the mechanism leaves uncovered whatever the run publishes: name -> (when(cfg,
# facts), line); `facts` are the run's (privacy_report.report_facts)
INFLUENCES: dict[str, tuple[Callable, str]] = {
    "pooled_scaling": (
        lambda cfg, f: f.get("pooled_scaling", False),
        "feature_scaling 'pooled': the standardisation mean and deviation are computed from "
        "every client's raw training data without noise, so one client's data moves every "
        "client's inputs in every round; that influence is not covered by epsilon (use "
        "feature_scaling 'per_client' or 'none')"),
    "analyzer_tiers": (
        lambda cfg, f: cfg.tier_source == "analyzer" and cfg.clip_parts == "tiers",
        "the tier map comes from the sensitivity analyzer, which reads every client's data "
        "without noise; the choice of tiers (and so of noise per feature) is not covered"),
    "allocated_budgets": (
        lambda cfg, f: _allocated(cfg),
        "client_budgets 'allocated': each client's budget is computed without noise from every "
        "client's example count, and it decides when each client stops taking part"),
    "cohort_overflow": (
        lambda cfg, f: f.get("cohort_overflow", 0) > 0,
        "{cohort_overflow} Poisson draws were dropped because the cohort was full (max_cohort); "
        "the analysis assumes every draw takes part: raise max_cohort"),
}


def bundle_rows(cfg) -> dict[str, tuple[str, str]]:
  """The summary.json paths the run's privacy bundles declare (the mechanism's
  `releases`; the kept noise's section, kept_noise.releases), looked up before SUMMARY:
  {path pattern: (status, says)}."""
  out: dict[str, tuple[str, str]] = {}
  for pattern, status, says in (*get_mechanism(cfg.dp).releases,
                                *kept_noise.releases(kept_noise_of(cfg))):
    out.setdefault(pattern, (status, says))   # the first declaration of a path holds
  return out


# the conditional statuses, in words (the README's table)
_CONDITIONS = {
    _by_budgets: "covered; not covered with client_budgets 'allocated'",
    _post_processing_under_local: "covered where each client noises its report before it "
                                  "leaves (dp 'local'); else not covered",
    _analyzer_tiers: "public; not covered with tier_source 'analyzer'",
    _seeded: "not covered under noise_seed 'config' (its seed); public under 'secret'",
}
