"""Sensitivity tiers of the data's features (the dynamic-DP paper): where they come
from when not given, and how sensitive each feature is:

  analyzer.py        the sensitivity analyzer: per-client scores fused into tiers
  sensitivity.py     its statistical branch (entropy, mutual information, ...)
  semantic.py        its semantic branch (a network on the feature names);
                     semantic_cache.py: the trained network, cached on disk
"""
