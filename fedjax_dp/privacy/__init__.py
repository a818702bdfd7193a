"""Differential privacy: mechanisms, the in-round DP stages, accountants, reports, the sensitivity analyzer."""
