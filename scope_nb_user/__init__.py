"""verifiers' name for scope_nb's user-seat environment: `{"id": "scope-nb-user"}` loads `ScopeUserEnv`.

verifiers imports an environment by a top-level module name and takes the one `vf.Env` subclass its `__all__`
exports; the environment itself is written in nbs/interop/47_verifiers.ipynb (scope_nb.interop.verifiers)."""
from scope_nb.interop.verifiers import ScopeUserEnv

__all__ = ["ScopeUserEnv"]
