"""From q(u) to q(f(X)) (:mod:`sparsegp_common.variational.conditionals`), on JAX arrays (jit- and grad-safe)."""
from sparsegp_common.variational.conditionals import *  # noqa: F403  (its __all__)
