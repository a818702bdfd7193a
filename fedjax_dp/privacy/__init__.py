"""Differential privacy: what runs in or accounts the round. The mechanisms and
their in-round DP stages (setup's Privacy record, dp_round, mechanisms, boundary,
noise_control, budgets), the accountants (accounting, amplification, planning) and
the sensitivity tiers (tiers/). Reading the config's DP keys is the edge's
(recipes/privacy.py, recipes/release_identity.py); what a run publishes is
experiment/'s (releases.py, release_registry.py, reports/); attacks and audits are
adversary/'s."""
