"""Interop: verifiers tasksets as environments, scope_nb user simulators inside verifiers rollouts."""
