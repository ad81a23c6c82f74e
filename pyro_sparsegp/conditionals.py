"""From q(u) to q(f(X)): see :mod:`sparsegp_common.conditionals`."""
from sparsegp_common.conditionals import Unwhitened, Whitened, conditional, strategy

__all__ = ["Unwhitened", "Whitened", "conditional", "strategy"]
