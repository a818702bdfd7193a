"""Differential privacy: what runs in or accounts the round. The mechanisms and
their in-round DP stages (setup, dp_round, mechanisms, boundary, noise_control,
budgets), the accountants (accounting, amplification, planning), the release
registry (release_registry, releases, release_identity) and the sensitivity tiers
(tiers/). The report is experiment/reports/'s; attacks and audits are adversary/'s."""
