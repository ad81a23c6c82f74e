"""Basis networks of the deep basis kernels (Zhu, Yuchi & Xie, 2025): ``phi: R^D -> R^r``, written
once for torch modules and equinox modules (:func:`network_classes`)."""
from sparsegp_common.checks import positive_int
from sparsegp_common.ops import namespace

RANK = 128  # basis functions r (paper: 128 by default)
HIDDEN = 128  # hidden units per layer (paper: 128, tanh)
DEPTH = 2  # hidden layers of the MLP, residual blocks of the ResNet (paper: 2)


def check_network(input_dim, rank, hidden, depth):
    """``(input_dim, rank, hidden, depth)`` as positive ints, or a ValueError/TypeError naming the bad one."""
    return (positive_int(input_dim, "input_dim"), positive_int(rank, "rank"), positive_int(hidden, "hidden"),
            positive_int(depth, "depth"))


def check_basis_net(net):
    """A basis network must carry integer attributes ``input_dim`` and ``rank``; returns it."""
    for attr in ("input_dim", "rank"):
        if not isinstance(getattr(net, attr, None), int):
            raise TypeError(f"net must have an integer attribute `{attr}` (as MLP and ResNet do)")
    return net


class _Network:
    """What :class:`MLP` and :class:`ResNet` share in both backends: the checked sizes, the layers
    in the order of their weights (``_assemble``) and the forward pass of the array API (one
    ``(D,)`` row or ``(N, D)`` rows). A backend supplies a module base class (see
    :func:`network_classes`) with ``_linears(sizes, dtype, seed)``, its linear layers of the
    ``(in, out)`` sizes initialised from ``seed``, and ``_sequence(layers)``, a list of them."""

    def __init__(self, input_dim, rank=RANK, hidden=HIDDEN, depth=DEPTH, *, dtype=None, seed=None):
        super().__init__()
        self.input_dim, self.rank, hidden, depth = check_network(input_dim, rank, hidden, depth)
        self._assemble(self._linears(self._sizes(hidden, depth), dtype, seed))


class MLP(_Network):
    """Basis network ``phi(x) = W_out h_depth + b_out``, ``h_k = tanh(W_k h_{k-1} + b_k)``, ``h_0 = x``:
    a ``torch.nn.Module`` in Pyro, an equinox module in NumPyro.

    Args:
        input_dim: D.
        rank: number of basis functions r (the output size).
        hidden: units per hidden layer.
        depth: hidden layers.
        dtype: parameter dtype (torch's default or JAX's default float when None).
        seed: seeds the default initialisation of the backend (torch's: from the global RNG when
            None, which is left as it was otherwise; equinox's: from 0 when None).

    Maps inputs ``(N, D)`` to features ``(N, r)`` (NumPyro: also a single ``(D,)`` row to ``(r,)``).
    """

    _layers = ("hidden", "head")

    def _sizes(self, hidden, depth):
        inputs = [self.input_dim] + [hidden] * depth
        return list(zip(inputs[:-1], inputs[1:])) + [(hidden, self.rank)]

    def _assemble(self, layers):
        self.hidden, self.head = self._sequence(layers[:-1]), layers[-1]

    def _forward(self, h):
        xp = namespace(h)
        for layer in self.hidden:
            h = xp.tanh(layer(h))
        return self.head(h)


class ResNet(_Network):
    """Residual basis network: ``h_0 = W_in x + b_in``, ``h_k = h_{k-1} + tanh(W_k h_{k-1} + b_k)``,
    ``phi(x) = W_out h_depth + b_out`` (our reading of the paper's 2-layer ResNet, section 4).

    Args: as for :class:`MLP` (``depth`` counts residual blocks).
    """

    _layers = ("input", "blocks", "head")

    def _sizes(self, hidden, depth):
        return [(self.input_dim, hidden)] + [(hidden, hidden)] * depth + [(hidden, self.rank)]

    def _assemble(self, layers):
        self.input, self.blocks, self.head = layers[0], self._sequence(layers[1:-1]), layers[-1]

    def _forward(self, x):
        xp = namespace(x)
        h = self.input(x)
        for block in self.blocks:
            h = h + xp.tanh(block(h))
        return self.head(h)


def network_classes(base, module):
    """The backend's :class:`MLP` and :class:`ResNet`: each core network on the backend's module
    class ``base`` (which comes after it, so ``super().__init__()`` reaches it), its layers
    declared as fields, as equinox modules need (torch ignores the declaration)."""
    return tuple(
        type(base)(cls.__name__, (cls, base), {"__module__": module, "__qualname__": cls.__name__, "__doc__": cls.__doc__,
                                               "__annotations__": dict.fromkeys(cls._layers, object)})
        for cls in (MLP, ResNet)
    )
