"""From q(u) to q(f(X)) (:mod:`sparsegp_common.variational.conditionals`), on torch tensors under autograd."""
from sparsegp_common.variational.conditionals import *  # noqa: F403  (its __all__)
