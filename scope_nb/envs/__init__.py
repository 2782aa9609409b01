"""Environments: the shared base, Persuasion for Good, tau2-bench, CooperBench, the CPU lab and the shop game."""
