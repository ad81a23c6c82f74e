"""Inducing features ("inducing variables") and their covariances.

``Kuu(features, kernel)`` (shape ``batch_shape + (M, M)``, without jitter; or None when the
features are orthonormal by construction, ``Kuu = I``) and ``Kuf(features, kernel, X)``
(``batch_shape + (M, N)``) dispatch on the pair of types, as in GPflow: a new kind of feature
(inter-domain, orthogonal, harmonic) subclasses :class:`Features` and registers its own pair.
Features with a component axis also answer ``component_variances(features, kernel, X)``: each
component's prior variance ``k_t(x, x)``, ``component_shape + (N,)``.
"""
from sparsegp_common.dispatch import Dispatcher
from sparsegp_common.kernels import Kernel
from sparsegp_common.ops import namespace

Kuu = Dispatcher("Kuu")
Kuf = Dispatcher("Kuf")
component_variances = Dispatcher("component_variances")


class Features:
    """Base class of inducing features: ``num_inducing`` (M) and ``input_dim`` (D).

    ``component_shape`` (default ``()``): features of ``f = sum_t f_t`` over independent
    components (the harmonic decomposition, additive models) declare their component axis here,
    e.g. ``(T,)``; their ``Kuu``/``Kuf`` then have that leading shape, q(u) gets one block per
    component, and the prior sums the component marginals in one place
    (:func:`~sparsegp_common.variational.conditionals.sum_components`).
    """

    component_shape = ()

    @property
    def num_inducing(self):
        """M, from the inducing inputs ``Z`` (``..., M, D``) of features located at inputs; other
        features override it."""
        return self.Z.shape[-2]

    @property
    def input_dim(self):
        return self.Z.shape[-1]


class InducingPoints(Features):
    """Inducing inputs ``Z`` (M, D), learnable; ``u = f(Z)``."""

    def __init__(self, Z):
        super().__init__()
        Z = self._checks.inputs(Z, "Z")
        self._param("Z", namespace(Z).asarray(Z, copy=True))


@Kuu.register(InducingPoints, Kernel)
def _kuu_points(features, kernel):
    return kernel.K(features.Z)


@Kuf.register(InducingPoints, Kernel)
def _kuf_points(features, kernel, X):
    return kernel.K(features.Z, X)


@component_variances.register(Features, Kernel)
def _kernel_components(features, kernel, X):
    """A kernel with a batch axis per component (an additive model) holds each ``k_t(x, x)``."""
    K = kernel.K_diag(X)
    if K.ndim < len(features.component_shape) + 1:
        raise ValueError(f"{type(features).__name__} do not say how their components split k(x, x): register "
                         "component_variances for them and the kernel")
    return K


CLASSES = (InducingPoints,)
