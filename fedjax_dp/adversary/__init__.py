"""What an adversary does to a run, and what a run's auditor measures, one module each
(out of privacy/, which holds what runs in or accounts the round, and robust/, which
holds the aggregation rules):

  attacks.py     Byzantine clients' uploads (sign flip, scaling, Gaussian, ALIE, IPM),
                 where each acts against the mechanism's trust boundary
  poisoning.py   data attacks: label flipping, targeted relabelling, backdoor triggers
  membership.py  loss-threshold and shadow-model membership inference (attack mia)
  attribute.py   attribute inference (attack attribute)
  audit.py       the audit's canary clients and the one-shot epsilon estimate
"""
