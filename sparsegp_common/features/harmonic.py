"""Harmonic kernel decomposition (Sun, Shi, Wilson & Grosse, "Scalable Variational Gaussian Processes
via Harmonic Kernel Decomposition", ICML 2021): the groups of transformations and the inter-domain
features of the components.

For a T~-cyclic map ``G`` of the inputs (``G^T~ = id``) under which the kernel is invariant
(``k(Gx, Gx') = k(x, x')``), the real components

    k_t(x, x') = sum_s w_t(s) k(x, G^s x'),    w_t(s) = c_t / T~ cos(2 pi t s / T~),

``t = 0 .. floor(T~/2)``, with ``c_t = 2`` except ``c_0 = 1`` and ``c_{T~/2} = 1`` for even T~ (the
paper's Sec. 3.4 displays ``2/T~`` for every row; rows 0 and T~/2 take ``1/T~``, or the components
would not sum to ``k``), are kernels whose sum is ``k`` and whose RKHSs are orthogonal (Thm. 3.5,
Thm. 3.8). Several commuting maps (``J`` ways, Sec. 3.5) take products of the per-way weights.

The inducing variable of component ``t`` at ``z`` is ``u_t = sum_s w_t(s) f(G^s z)`` (App. B):
``Cov(u_t, f(x)) = k_t(z, x)`` and ``Cov(u_t, u_t') = 0`` for ``t != t'`` wherever the points are,
so ``Kuu`` is block-diagonal, one ``m x m`` block per component. :class:`HarmonicFeatures` carries
that block axis as its ``component_shape``; the SVGP then holds one q per block (the paper's HVGP,
Eq. 21) and adds the components' updates to the prior ``k(x, x)`` once.
"""
import functools
import itertools
import math
import numbers

import numpy as np

from sparsegp_common.features import Features, Kuf, Kuu, component_variances
from sparsegp_common.features.nystrom import trace_error
from sparsegp_common.kernels import Kernel, Product, SquaredExponential, Stationary, Sum, expanded_product
from sparsegp_common.ops import backend, device, namespace

__all__ = [  # what the backends re-export (HarmonicFeatures adapted)
    "CyclicMap", "ImageFlips", "ImageTranslation", "MultiWay", "Negation", "Reflections", "Rotation", "Transformation",
    "check_invariant", "real_weights", "trace_error",
]


def real_weights(order):
    """Weights ``w_t(s)`` of the real components of one cyclic map of order T~: shape
    ``(floor(T~/2) + 1, T~)``; each column ``s != 0`` sums to 0 and column 0 to 1, so the
    components sum to the kernel. ``order=2`` gives ``[[1, 1], [1, -1]] / 2`` (even and odd parts)."""
    if isinstance(order, bool) or not isinstance(order, numbers.Integral) or order < 1:
        raise ValueError(f"the order of a cyclic map must be a positive integer, got {order!r}")
    t, s = np.arange(order // 2 + 1)[:, None], np.arange(order)[None, :]
    c = np.where((t == 0) | (2 * t == order), 1.0, 2.0)
    w = c / order * np.cos(2 * np.pi * ((t * s) % order) / order)
    w[np.abs(w) < 1e-15] = 0.0  # cos(pi / 2) and the like: exact zeros
    return w


class Transformation:
    """A group of commuting cyclic maps ``G_1 .. G_J`` of the inputs, of orders ``orders``
    (``T~_1 .. T~_J``). Subclasses define :meth:`apply` for one multi-index ``s``.

    ``keeps_axes``: every map sends each coordinate to plus or minus itself about a centre, so a
    stationary kernel with ARD lengthscales stays invariant; otherwise (rotations, reflections
    along other directions, permutations) the kernel needs one shared lengthscale.

    ``isometric``: every element is ``G^s x = c + R_s (x - c)`` with ``R_s`` orthogonal, given by
    :meth:`linear` about :attr:`center`; stationary kernels then reuse the norms of the inputs and
    compute only inner products per element (the paper's code, Sun et al. 2021, Sec. 4.3).
    """

    orders = ()
    keeps_axes = False
    isometric = False
    center = 0.0

    def apply(self, X, s):
        """``G_1^{s_1} .. G_J^{s_J} X`` for ``X (..., D)`` and a multi-index ``s`` (J integers)."""
        if not self.isometric:
            raise NotImplementedError
        if not any(s):
            return X
        center = _like(self.center, X)
        return center + self.linear(X - center, s)

    def linear(self, X, s):
        """``R_s X`` (isometric maps): the element ``s`` about the centre, applied to centred inputs."""
        raise NotImplementedError

    def inverse(self, s):
        """The multi-index of the inverse element: ``G^{-s}``."""
        return tuple((-k) % order for k, order in zip(s, self.orders))

    @property
    def num_components(self):
        """T, the number of real components: ``prod_j (floor(T~_j / 2) + 1)``."""
        return math.prod(order // 2 + 1 for order in self.orders)

    @property
    def elements(self):
        """The group's multi-indices ``s`` in the order of the columns of :meth:`weights`."""
        return list(itertools.product(*(range(order) for order in self.orders)))

    def weights(self):
        """``W (T, T~)``, ``T~ = prod_j T~_j``: the product of the per-way :func:`real_weights`."""
        return functools.reduce(np.kron, [real_weights(order) for order in self.orders], np.ones((1, 1)))

    def __repr__(self):
        return f"{type(self).__name__}(orders={self.orders})"


class Negation(Transformation):
    """``x -> 2 c - x`` (order 2): the even and odd parts of ``f`` about ``center`` (standardised
    inputs: 0). Any stationary kernel is invariant."""

    keeps_axes = isometric = True
    orders = (2,)

    def __init__(self, center=0.0):
        self.center = np.asarray(center, dtype=float)

    def linear(self, X, s):
        return -X if s[0] else X


class Reflections(Transformation):
    """J-way negation (Sec. 3.5): way ``j`` flips the sign of the coordinates ``subsets[j]`` of
    ``(x - center) @ basis`` (a basis of orthonormal columns; None: the input axes). The
    ``2^J`` orbit elements flip the unions of subsets. Build with :meth:`along_axes` or
    :meth:`pca` (the paper's regression experiments: 3 ways along principal directions)."""

    def __init__(self, subsets, basis=None, center=0.0):
        subsets = [sorted(int(i) for i in subset) for subset in subsets]
        flat = [i for subset in subsets for i in subset]
        if not subsets or any(not subset for subset in subsets) or len(set(flat)) != len(flat):
            raise ValueError(f"subsets must be non-empty and disjoint, got {subsets}")
        if basis is not None:
            basis = np.asarray(basis, dtype=float)
            if basis.ndim != 2 or not np.allclose(basis.T @ basis, np.eye(basis.shape[1]), atol=1e-8):
                raise ValueError("basis must be a (D, K) matrix of orthonormal columns")
            if max(flat) >= basis.shape[1]:
                raise ValueError(f"subsets name direction {max(flat)} but basis has {basis.shape[1]} columns")
        self.subsets, self.basis, self.center = subsets, basis, np.asarray(center, dtype=float)
        self.orders = (2,) * len(subsets)
        self.keeps_axes = basis is None
        self.isometric = True

    @classmethod
    def along_axes(cls, subsets, center=0.0):
        return cls(subsets, None, center)

    @classmethod
    def pca(cls, X, num_ways):
        """Reflections along the principal directions of the training inputs ``X (N, D)`` about
        their mean, directions dealt to the ``num_ways`` ways round-robin by decreasing variance
        (way j: the j-th, (J+j)-th, ... largest). The basis is fixed (not trained)."""
        X = np.asarray(X, dtype=float)
        if X.ndim != 2 or not np.isfinite(X).all():
            raise ValueError("X must be a finite (N, D) array")
        if isinstance(num_ways, bool) or not isinstance(num_ways, numbers.Integral) or not 1 <= num_ways <= X.shape[1]:
            raise ValueError(f"num_ways must be an integer in 1..{X.shape[1]} (the input dimension), got {num_ways!r}")
        center = X.mean(axis=0)
        variances, vectors = np.linalg.eigh(np.cov(X - center, rowvar=False).reshape(X.shape[1], X.shape[1]))
        basis = vectors[:, np.argsort(variances)[::-1]]
        return cls([range(j, X.shape[1], num_ways) for j in range(num_ways)], basis, center)

    def signs(self, s, num_directions):
        signs = np.ones(num_directions)
        for bit, subset in zip(s, self.subsets):
            if bit:
                signs[subset] *= -1
        return signs

    def linear(self, X, s):
        if not any(s):
            return X
        if self.basis is None:
            if max(max(subset) for subset in self.subsets) >= X.shape[-1]:
                raise ValueError(f"subsets name axis {max(map(max, self.subsets))} but the inputs have {X.shape[-1]}")
            return X * _like(self.signs(s, X.shape[-1]), X)
        basis = self.basis
        # x - 2 P_flipped x: exact for the directions outside the basis too
        flipped = basis * (self.signs(s, basis.shape[1]) < 0)
        return X - 2 * (X @ _like(flipped, X)) @ _like(basis.T, X)


class Rotation(Transformation):
    """Rotation by ``2 pi / order`` in the plane of the coordinates ``axes`` about ``center``
    (exact angles ``2 pi s / order``, not powers of one matrix)."""

    isometric = True

    def __init__(self, order, axes=(0, 1), center=0.0):
        real_weights(order)  # validates the order
        if len(axes) != 2 or axes[0] == axes[1]:
            raise ValueError(f"axes must be two different coordinates, got {axes!r}")
        self.orders, self.axes = (int(order),), tuple(int(a) for a in axes)
        self.center = np.asarray(center, dtype=float)

    def linear(self, X, s):
        (s,) = s
        if s == 0:
            return X
        D, (i, j) = X.shape[-1], self.axes
        if max(i, j) >= D:
            raise ValueError(f"Rotation axes {self.axes} need at least {max(i, j) + 1} input dimensions, got {D}")
        angle = 2 * np.pi * s / self.orders[0]
        R = np.eye(D)
        R[[i, i, j, j], [i, j, i, j]] = np.cos(angle), -np.sin(angle), np.sin(angle), np.cos(angle)
        return X @ _like(R.T, X)


class _Permutation(Transformation):
    """Maps that permute the coordinates (pixels): ``G^s x = x[perm_s]``, linear about 0."""

    isometric = True

    def __init__(self, image_shape):
        image_shape = tuple(int(n) for n in image_shape)
        if len(image_shape) not in (2, 3) or min(image_shape) < 1:
            raise ValueError(f"image_shape must be (height, width) or (height, width, channels), got {image_shape}")
        self.image_shape = image_shape

    def permutation(self, s):
        raise NotImplementedError

    def apply(self, X, s):
        if not any(s):
            return X
        if X.shape[-1] != math.prod(self.image_shape):
            raise ValueError(f"inputs have {X.shape[-1]} dimensions but image_shape {self.image_shape} has "
                             f"{math.prod(self.image_shape)} pixels")
        xp = namespace(X)
        return xp.take(X, xp.asarray(self.permutation(s), device=device(X)), axis=X.ndim - 1)

    linear = apply

    def _pixels(self):
        return np.arange(math.prod(self.image_shape)).reshape(self.image_shape)


class ImageTranslation(_Permutation):
    """Circular translations of images flattened row-major (channels last): ``step`` pixels
    down and right per application, of orders ``(height / step_h, width / step_w)`` (the
    paper's Translate-MNIST: 28 x 28 images, step 4, orders (7, 7), 16 real components)."""

    def __init__(self, image_shape, step):
        super().__init__(image_shape)
        step = (step, step) if isinstance(step, numbers.Integral) else tuple(step)
        if len(step) != 2 or any(not 1 <= k <= n or n % k for k, n in zip(step, self.image_shape)):
            raise ValueError(f"step must divide the image's height and width {self.image_shape[:2]}, got {step}")
        self.step = tuple(int(k) for k in step)
        self.orders = tuple(n // k for n, k in zip(self.image_shape, self.step))

    def permutation(self, s):
        return np.roll(self._pixels(), (s[0] * self.step[0], s[1] * self.step[1]), axis=(0, 1)).ravel()


class ImageFlips(_Permutation):
    """Up-down and left-right flips of images flattened row-major (channels last): orders (2, 2)."""

    orders = (2, 2)

    def permutation(self, s):
        pixels = self._pixels()
        return pixels[:: -1 if s[0] else 1, :: -1 if s[1] else 1].ravel()


class CyclicMap(Transformation):
    """A map of your own: ``generator(X (..., D)) -> (..., D)`` with ``generator^order = id``,
    written with the array API (it receives the backend's arrays). ``keeps_axes``: say True only
    if it maps each coordinate to plus or minus itself about a centre."""

    def __init__(self, generator, order, keeps_axes=False):
        if not callable(generator):
            raise TypeError(f"generator must be a function of X, got {generator!r}")
        real_weights(order)
        self.generator, self.orders, self.keeps_axes = generator, (int(order),), bool(keeps_axes)

    def apply(self, X, s):
        for _ in range(s[0]):
            X = self.generator(X)
        return X


class MultiWay(Transformation):
    """Commuting maps of several ways (Sec. 3.5), e.g. ``MultiWay(Rotation(4), Negation())``:
    the group elements are products, the weights Kronecker products of the ways' weights."""

    def __init__(self, *ways):
        if not ways or not all(isinstance(way, Transformation) for way in ways):
            raise TypeError("MultiWay takes one or more Transformation objects")
        self.ways = ways
        self.orders = tuple(order for way in ways for order in way.orders)
        self.keeps_axes = all(way.keeps_axes for way in ways)
        centers = [np.asarray(way.center, dtype=float) for way in ways]
        self.isometric = all(way.isometric for way in ways) and all(
            np.shape(c) == np.shape(centers[0]) and np.array_equal(c, centers[0]) for c in centers)
        self.center = centers[0]

    def _each(self, X, s, method):
        start = 0
        for way in self.ways:
            X = getattr(way, method)(X, s[start:start + len(way.orders)])
            start += len(way.orders)
        return X

    def apply(self, X, s):
        return self._each(X, s, "apply")

    def linear(self, X, s):
        return self._each(X, s, "linear")


def _like(a, X):
    return namespace(X).asarray(a, dtype=X.dtype, device=device(X))


def check_invariant(kernel, transformation):
    """Refuse a kernel that the library's kernels show not to be invariant under
    ``transformation``: a stationary kernel with ARD lengthscales under a map that mixes
    coordinates (the decomposition's pieces would then be neither symmetric nor positive
    semi-definite). Sums and products are checked factor by factor; kernels of your own are
    trusted (compare ``K(G X, G X')`` with ``K(X, X')`` to check one)."""
    if isinstance(kernel, (Sum, Product)):
        check_invariant(kernel.k1, transformation)
        check_invariant(kernel.k2, transformation)
    elif isinstance(kernel, Stationary) and not transformation.keeps_axes and kernel.lengthscale.shape[-1] > 1:
        raise ValueError(
            f"{type(kernel).__name__} with {kernel.lengthscale.shape[-1]} ARD lengthscales is not invariant under "
            f"{transformation!r}, which mixes input coordinates: give the kernel a single lengthscale, or use a "
            "transformation that keeps the axes (Negation, Reflections.along_axes)")


class HarmonicFeatures(Features):
    """Inter-domain features of the T real components of a harmonic kernel decomposition
    (Sun et al., 2021, App. B): ``m`` inducing inputs per component, ``component_shape = (T,)``.

    ``Kuu`` is ``(T, m, m)``, block t being ``k_t(Z_t, Z_t)``; ``Kuf`` is ``(T, m, N)``,
    ``k_t(Z_t, X)``, summed over the T~ group elements as it goes (memory ``O(T m N)``, not
    ``O(T T~ m N)``), or for a squared exponential under :class:`Negation` or :class:`Reflections`
    in closed form (a product of ``cosh`` and ``sinh`` over the ways). Give them to
    :class:`~sparsegp_common.priors.svgp.SVGP` for the paper's HVGP: one q block per component
    (full or ``diagonal``), ``O(T m^3)`` per step.

    Args:
        Z: initial inducing inputs, ``(m, D)`` (copied to every component) or ``(T, m, D)``.
        transformation: a :class:`Transformation` under which the kernel is invariant.
        shared: one set of ``(m, D)`` inputs for every component (the paper's TRAN-S; each group
            element's kernel matrix is then computed once for all components).
    """

    def __init__(self, Z, transformation, shared=False):
        super().__init__()
        if not isinstance(transformation, Transformation):
            raise TypeError(f"transformation must be a Transformation, got {transformation!r}")
        T = transformation.num_components
        Z = self._checks.as_array(Z, "Z")
        if Z.ndim == 3 and not shared:
            if Z.shape[0] != T:
                raise ValueError(f"Z has {Z.shape[0]} component blocks but {transformation!r} has {T} components")
            self._checks.inputs(namespace(Z).reshape(Z, (-1, Z.shape[-1])), "Z")
        else:
            Z = self._checks.inputs(Z, "Z")
            if not shared:
                Z = namespace(Z).broadcast_to(Z, (T,) + tuple(Z.shape))
        self.transformation, self.shared = transformation, bool(shared)
        self.component_shape = (T,)
        self._param("Z", namespace(Z).asarray(Z, copy=True))

    def orbit_sum(self, kernel, X=None):
        """``sum_s W[:, s] k(G^s Z, X)`` (``X`` None: ``Z``): ``(T, m, N)``."""
        flips = _sign_flips(self.transformation, kernel, self.Z.shape[-1])
        if flips is not None:
            return _flip_products(flips, self.transformation.center, kernel, self.Z, X)
        return _orbit_sum(self.transformation, _orbit_kernel(self.transformation, kernel, self.Z, X),
                          has_component_axis=not self.shared)


def _sign_flips(transformation, kernel, input_dim):
    """``(subsets, basis)`` where the orbit sum has :func:`_flip_products`' closed form: a squared
    exponential (one variance) under sign flips of directions (:class:`Negation`,
    :class:`Reflections`); otherwise None."""
    if not (isinstance(kernel, SquaredExponential) and kernel.own_shape and kernel.lengthscale.ndim == 1
            and kernel.variance.ndim == 0):
        return None
    if isinstance(transformation, Negation):
        return [list(range(input_dim))], None
    if isinstance(transformation, Reflections):
        return transformation.subsets, transformation.basis
    return None


def _flip_products(flips, center, kernel, Z, X=None):
    """The components of a squared exponential under J ways of sign flips, in closed form:
    ``(T, m, N)`` (``X`` None: ``Z``; ``Z`` with or without the component axis).

    With ``c_j`` the inner product of the scaled, centred inputs over way j's directions and
    ``r`` the rest, ``k(G^s z, x) = v exp(-(|z|^2 + |x|^2) / 2 + r + sum_j sigma_j c_j)`` for the
    signs ``sigma_j`` of ``s``, so the weights' sum factorises over the ways:
    ``k_t(z, x) = v exp(-(|z|^2 + |x|^2) / 2 + r) prod_j (cosh c_j, or sinh c_j where the component
    is odd in way j)``: J products of the inputs and ``J + 1`` exponentials per entry, where the
    orbit takes ``2^J`` kernel matrices. Each factor is written as ``e^{|c|} (e^{c - |c|} +- e^{-c - |c|}) / 2``
    with the ``e^{|c|}`` moved into the one exponent, which is then minus half the smallest squared
    distance over the orbit: nothing overflows, and the derivative at ``c = 0`` is exact. The
    elementwise work is one node with its derivatives in closed form (:func:`_flip_terms`)."""
    subsets, basis = flips
    xp = namespace(Z) if X is None else namespace(Z, X)
    kernel._check_dimension(Z.shape[-1])
    matmul, lengthscale = backend(Z).precise_matmul, kernel.lengthscale
    Zs = (Z - _like(center, Z)) / lengthscale
    z_half = -xp.sum(Zs**2, axis=-1) / 2
    if X is None:
        left, right, y_half = Zs, Zs, z_half
    else:
        Xc = X - _like(center, Z)
        y_half = -xp.sum((Xc / lengthscale) ** 2, axis=-1) / 2
        # both lengthscales on Z's side where the basis allows: the products then differentiate
        # only Z's side (X is data), sparing a (N, T m) x (T m, D) product per way
        left, right = (Zs / lengthscale, Xc) if basis is None or lengthscale.shape[-1] == 1 else (Zs, Xc / lengthscale)
    rest = sum(len(subset) for subset in subsets) < Z.shape[-1]  # directions that no way flips
    if rest:  # r: the whole inner product, less each way's (in _flip_terms)
        exponent = expanded_product(left, right, z_half, y_half)
    else:
        exponent = z_half[..., :, None] + y_half[..., None, :]
    if basis is not None:
        left, right = left @ _like(basis, left), right @ _like(basis, right)
    inner = []
    for subset in subsets:
        way = np.zeros(left.shape[-1])
        way[subset] = 1.0
        inner.append(matmul(left * _like(way, left), right.mT))  # a mask rather than a gather: XLA's gather is slow here
    # k_t(z, z): the exponent on the diagonal is exactly 0 (what the expansion leaves is round-off)
    terms = functools.partial(_flip_terms, len(subsets), rest, X is None)
    return (kernel.variance / 2 ** len(subsets)) * backend(Z).with_partials(terms, exponent, *inner)


def _flip_terms(num_ways, rest, square, exponent, *inner):
    """The elementwise part of :func:`_flip_products` with its partial derivatives, as one node:
    ``(K, partials)`` with ``K = exp(min(x, 0)) prod_j f_j`` ``(T, m, N)``, one factor per way,
    ``f_j = 1 + t_j`` (even) or ``sign(c_j) (1 - t_j)`` (odd), ``t_j = exp(-2 |c_j|)``, and ``x`` the
    ``exponent`` plus ``sum_j |c_j|`` (less ``c_j`` with ``rest``), zero on the diagonal if ``square``.
    The derivative of ``e^{|c|} f`` swaps the parity, so ``dK/dc_j = K (sign(c_j) - rest) + e^x
    f_j' prod_{i != j} f_i`` with ``f_j' = -2 sign(c_j) t_j`` (even) or ``2 t_j`` (odd); where
    the exponent is clipped or masked, only the factors' part."""
    xp = namespace(exponent, *inner)
    odd = np.array(list(itertools.product((0.0, 1.0), repeat=num_ways)))  # (T, J): the rows of weights()
    unit = xp.asarray(1.0, dtype=exponent.dtype, device=device(exponent))
    factors, slopes, signs = [], [], []
    for j, c in enumerate(inner):
        # +-1 by c's sign bit: at c = 0 either gives the same values and slopes (f_j or f_j' is 0
        # there), and it is one pass where the array API's sign (NaN-preserving) takes three in torch
        size, sign = xp.abs(c), xp.copysign(unit, c)
        exponent = exponent + (size - c if rest else size)
        t = xp.exp(-2 * size)
        signed = sign * t
        parity = _like(odd[:, j].reshape(-1, 1, 1), c) > 0
        factors.append(xp.where(parity, sign - signed, 1 + t))
        slopes.append(xp.where(parity, 2 * t, -2 * signed))
        signs.append(sign - 1 if rest else sign)
    live = exponent < 0
    if square:
        diagonal = xp.eye(exponent.shape[-1], dtype=xp.bool, device=device(exponent))
        exponent, live = xp.where(diagonal, 0.0, exponent), live & ~diagonal
    envelope = xp.exp(xp.clip(exponent, max=0.0))
    before, after = [envelope], [None] * num_ways  # products of the factors before and after way j
    for factor in factors[:-1]:
        before.append(before[-1] * factor)
    for j in range(num_ways - 1, 0, -1):
        after[j - 1] = factors[j] if after[j] is None else after[j] * factors[j]
    K = before[-1] * factors[-1]
    through_exponent = xp.where(live, K, 0.0)
    partials = [through_exponent]
    for j in range(num_ways):
        others = before[j] if after[j] is None else before[j] * after[j]
        partials.append(through_exponent * signs[j] + slopes[j] * others)
    return K, partials


def _orbit_kernel(transformation, kernel, Z, X=None):
    """``term(s) = k(G^s Z, X)`` (``X`` None: ``Z``, the identity's diagonal exact), ``Z`` with or
    without the component axis.

    A stationary kernel under an isometric map (``|G^s z - x| = |R_s (z - c) - (x - c)|``) reuses
    the centred, scaled inputs and their norms: each element costs one product of inner
    products, applied to the side with fewer rows (``R_s z . x = z . R_s^{-1} x``), instead of
    rescaling and norming its transformed copy (Sun et al. 2021, Sec. 4.3)."""
    fast = (isinstance(kernel, Stationary) and transformation.isometric and kernel.lengthscale.ndim == 1
            and kernel.variance.ndim == 0)
    if not fast:
        Y = Z if X is None else X
        return lambda s: kernel.K(Z, X) if X is None and not any(s) else kernel.K(transformation.apply(Z, s), Y)
    xp = namespace(Z) if X is None else namespace(Z, X)
    kernel._check_dimension(Z.shape[-1])
    center, lengthscale = _like(transformation.center, Z), kernel.lengthscale
    Zs = (Z - center) / lengthscale
    Ys = Zs if X is None else (X - center) / lengthscale
    z2, y2 = xp.sum(Zs**2, axis=-1), xp.sum(Ys**2, axis=-1)
    move_data = Ys.shape[-2] < math.prod(Zs.shape[:-1])

    def term(s):
        if X is None and not any(s):
            return kernel.K(Z)
        if move_data:
            left, right = Zs, transformation.linear(Ys, transformation.inverse(s))
        else:
            left, right = transformation.linear(Zs, s), Ys
        # |left - right|^2 as one product (isometric maps keep the norms); its round-off below
        # zero is left to the shape function (Matern: read as zero; squared exponential: harmless)
        return kernel.variance * kernel.shape_fn(expanded_product(left, right, z2, y2, -2.0))
    return term


def _orbit_sum(transformation, term, has_component_axis):
    """``sum_s W[:, s] term(s)`` over the group's elements ``s``, ``(T,) + ...``; ``term(s)`` has
    the component axis first or not at all."""
    total = None
    for column, s in zip(transformation.weights().T, transformation.elements):
        value = term(s)
        weight = _like(column, value)
        weight = namespace(weight).reshape(weight, (-1,) + (1,) * (value.ndim - has_component_axis))
        total = weight * value if total is None else total + weight * value
    return total


@Kuu.register(HarmonicFeatures, Kernel)
def _kuu_harmonic(features, kernel):
    check_invariant(kernel, features.transformation)
    K = features.orbit_sum(kernel)
    return (K + K.mT) / 2  # k_t is symmetric; round-off is not


@Kuf.register(HarmonicFeatures, Kernel)
def _kuf_harmonic(features, kernel, X):
    check_invariant(kernel, features.transformation)
    return features.orbit_sum(kernel, X)


@component_variances.register(HarmonicFeatures, Kernel)
def _harmonic_variances(features, kernel, X):
    """``k_t(x, x) = sum_s w_t(s) k(x, G^s x)``: ``(T, N)``, one kernel value per point and element."""
    check_invariant(kernel, features.transformation)
    transformation, pairs = features.transformation, X[:, None, :]  # a batch of N one-point sets
    return _orbit_sum(transformation, lambda s: kernel.K(pairs, transformation.apply(pairs, s))[..., 0, 0] if any(s)
                      else kernel.K_diag(X), has_component_axis=False)


CLASSES = (HarmonicFeatures,)
