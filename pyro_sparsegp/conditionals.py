"""From q(u) to q(f(X)) (:mod:`sparsegp_common.conditionals`), on torch tensors under autograd."""
from sparsegp_common.conditionals import Unwhitened, Whitened, conditional, strategy

__all__ = ["Unwhitened", "Whitened", "conditional", "strategy"]
