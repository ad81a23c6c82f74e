"""Observation windows and integration rules of Cox processes (NumPy only, shared by both backends).

A *window* is the region ``W`` the events were observed in: an :class:`Interval`, a
:class:`Rectangle` (any dimension, a box), a :class:`Polygon`, or a :class:`UserRule`, a window
given only through an integration rule of the user's (points and weights, e.g. for a disc).

A *rule* says how ``int_W g(x) dx`` is estimated; :meth:`Rule.layout` returns the
:class:`Layout` the backends evaluate:

* :class:`GaussLegendre`: fixed nodes, tensor product in several dimensions (deterministic);
* :class:`StratifiedMC`: the box is cut into equal cells and one uniform point is drawn in each,
  fresh at every step from the backend's RNG; ``sum_j |cell| g(U_j)`` is unbiased because
  ``E[|cell| g(U_j)] = int_cell g``;
* :class:`Binned`: the box is cut into cells whose event counts are Poisson with mean
  ``|cell| * lambda(centre)``, the gridded-data form of the likelihood.
"""
import math
from typing import NamedTuple

import numpy as np

from sparsegp_common.checks import positive_int
from sparsegp_common.ops import device, namespace


class Layout(NamedTuple):
    """What a backend needs to evaluate a rule on a window.

    Attributes:
        points: ``(P, d)`` nodes (:class:`GaussLegendre`, :class:`UserRule`), lower cell
            corners (:class:`StratifiedMC`) or cell centres (:class:`Binned`).
        weights: ``(P,)`` quadrature weights, or cell volumes.
        widths: ``(d,)`` cell widths (cell rules), else None.
        low: ``(d,)`` lower corner of the box (cell rules), else None.
        strides: ``(d,)`` integer strides of the C-ordered cell index (cell rules), else None.
        shape: cells per dimension (cell rules), else None.
    """

    points: np.ndarray
    weights: np.ndarray
    widths: np.ndarray | None = None
    low: np.ndarray | None = None
    strides: np.ndarray | None = None
    shape: tuple | None = None


class Rule:
    """Base class of integration rules: where the nodes go on a window (:meth:`layout`), the nodes
    of one evaluation (:meth:`nodes`) and, for rules with fixed nodes, their :meth:`spacing`.
    ``random`` rules draw fresh nodes at every evaluation (the caller then passes draws)."""

    random = False

    def layout(self, window):
        raise NotImplementedError

    def nodes(self, points, widths, uniform=None):
        """This evaluation's nodes from the layout's ``points`` ``(P, d)`` (backend arrays): the
        points themselves (fixed rules). ``widths``: the cells' sides; ``uniform``: ``(P, d)``
        draws on ``[0, 1)`` for random rules, None for their fixed stand-in."""
        return points

    def spacing(self, layout, window):
        """The spacing ``(d,)`` of fixed nodes (see :func:`node_spacing`), below which a lengthscale
        lets the intensity hide between them; None where the nodes move or the data are cells."""
        return node_spacing(layout, window)


# ---------------------------------------------------------------- windows


def _pairs(value, name, rows, min_rows):
    """``value`` as finite float64 ``(rows, 2)`` with at least ``min_rows`` rows."""
    try:
        array = np.array(value, dtype=np.float64, ndmin=2)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be numbers of shape ({rows}, 2), got {value!r}") from None
    if array.ndim != 2 or array.shape[1] != 2 or array.shape[0] < min_rows:
        at_least = f" with {rows} >= {min_rows}" if min_rows > 1 else ""
        raise ValueError(f"{name} must have shape ({rows}, 2){at_least}, got {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contain NaN or inf")
    return array


class Window:
    """Base class: ``dim``, ``volume``, ``bounds`` (a bounding box ``(d, 2)``) and ``contains``."""

    dim = None
    volume = None
    bounds = None

    def contains(self, X):
        """Whether each row of ``X`` ``(N, d)`` lies in the window (borders included): ``(N,)`` bool."""
        X = np.asarray(X, dtype=np.float64)
        return np.all((X >= self.bounds[:, 0]) & (X <= self.bounds[:, 1]), axis=-1)

    def default_rule(self):
        """Gauss-Legendre with 64 nodes in 1-D, 32 per dimension otherwise."""
        return GaussLegendre(64 if self.dim == 1 else 32)

    def own_rule(self):
        """The integration rule that defines this window (None: the window is a region any rule
        can cover)."""
        return None

    def restrict(self, points, weights):
        """A rule's nodes ``(P, d)`` and weights ``(P,)`` (the backend's arrays) for this window:
        as they are, for windows the rules cover exactly."""
        return points, weights


class Rectangle(Window):
    """A box ``prod_k [low_k, high_k]``.

    Args:
        bounds: ``(d, 2)`` rows of ``(low, high)`` (a ``PointPattern.window``), finite, with
            ``low < high`` in every dimension.
    """

    def __init__(self, bounds):
        bounds = _pairs(bounds, "window bounds", "d", 1)
        if not np.all(bounds[:, 1] > bounds[:, 0]):
            raise ValueError(f"the window has zero size: every low must be below its high, got {bounds.tolist()}")
        self.bounds = bounds
        self.dim = bounds.shape[0]
        self.volume = float(np.prod(bounds[:, 1] - bounds[:, 0]))

    def __repr__(self):
        return f"{type(self).__name__}({self.bounds.tolist()})"


class Interval(Rectangle):
    """The 1-D window ``[low, high]``."""

    def __init__(self, low, high):
        super().__init__([[low, high]])


class UserRule(Window, Rule):
    """A window given by an integration rule: ``int_W g ~= sum_j weights_j g(points_j)``.

    Args:
        points: ``(P, d)`` nodes inside the window.
        weights: ``(P,)`` non-negative weights with a positive sum (the window's area).
        contains: optional ``contains(X) -> (N,) bool`` for NumPy ``X``: used to check the events
            and to simulate; by default the bounding box of ``points``.
    """

    def __init__(self, points, weights, contains=None):
        points = np.array(points, dtype=np.float64, ndmin=2)
        weights = np.asarray(weights, dtype=np.float64)
        if points.ndim != 2 or weights.shape != points.shape[:1]:
            raise ValueError(f"points must be (P, d) and weights (P,), got {points.shape} and {weights.shape}")
        if not (np.all(np.isfinite(points)) and np.all(np.isfinite(weights))):
            raise ValueError("points and weights of a UserRule must be finite")
        if np.any(weights < 0) or not weights.sum() > 0:
            raise ValueError("the window has zero size: weights must be non-negative with a positive sum")
        if contains is not None and not callable(contains):
            raise TypeError(f"contains must be callable, got {type(contains).__name__}")
        self.points, self.weights, self._contains = points, weights, contains
        self.dim, self.volume = points.shape[1], float(weights.sum())
        self.bounds = np.stack([points.min(0), points.max(0)], axis=1)

    def contains(self, X):
        if self._contains is None:
            return super().contains(X)
        return np.asarray(self._contains(np.asarray(X, dtype=np.float64)), dtype=bool)

    def default_rule(self):
        return self

    own_rule = default_rule

    def layout(self, window):
        return Layout(self.points, self.weights)


class Polygon(Window):
    """A 2-D polygon (simple, or any even-odd region), e.g. a survey area.

    Rules on it (the default :class:`StratifiedMC`, :class:`GaussLegendre`, a raster's
    :class:`~sparsegp_common.data.raster.PixelRule`) lay out their nodes on its bounding box; nodes
    outside get weight 0 (:meth:`indicator`), so a randomised rule stays unbiased for the integral
    over the polygon, and they are moved to :attr:`anchor`, an inside point, so that covariates
    need values only inside.

    Args:
        vertices: ``(K, 2)``, ``K >= 3``, in order (either orientation; not closed: the last
            vertex joins the first).
    """

    def __init__(self, vertices):
        vertices = _pairs(vertices, "vertices", "K", 3)
        x, y = vertices.T
        area = 0.5 * abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))  # shoelace
        if not area > 0:
            raise ValueError("the polygon has zero area")
        self.vertices, self.dim, self.volume = vertices, 2, float(area)
        self.bounds = np.stack([vertices.min(0), vertices.max(0)], axis=1)
        self.anchor = self._inside_point()

    def indicator(self, X):
        """``1.0`` for rows of ``X`` ``(N, 2)`` inside (even-odd rule), else ``0.0``, in ``X``'s
        array type (NumPy, torch, JAX: used inside the backends' steps)."""
        xp = namespace(X)
        v = xp.asarray(self.vertices, dtype=X.dtype, device=device(X))
        start, end = v, xp.roll(v, -1, axis=0)
        px, py = X[:, :1], X[:, 1:]
        straddles = (start[:, 1] > py) != (end[:, 1] > py)  # (N, K): the edge crosses the line y = py
        dy = xp.where(straddles, end[:, 1] - start[:, 1], xp.ones_like(start[:, 1]))
        crossing = start[:, 0] + (py - start[:, 1]) * (end[:, 0] - start[:, 0]) / dy
        count = xp.sum(xp.astype(straddles & (px < crossing), xp.int32), axis=1)
        return xp.astype(count % 2 == 1, X.dtype)

    def contains(self, X):
        return self.indicator(np.asarray(X, dtype=np.float64)) > 0

    def restrict(self, points, weights):
        """Nodes outside weigh nothing, and move to :attr:`anchor` (covariates are read inside only)."""
        xp = namespace(points)
        inside = self.indicator(points)
        anchor = xp.asarray(self.anchor, dtype=points.dtype, device=device(points))
        return xp.where(inside[:, None] > 0, points, anchor), weights * inside

    def _inside_point(self):
        """A point well inside: the centre of the widest inside run along the middle row of a grid."""
        (x0, x1), (y0, y1) = self.bounds
        for y in (y0 + (y1 - y0) * np.array([0.5, 0.25, 0.75, 0.125, 0.875])):
            xs = np.linspace(x0, x1, 1025)
            inside = self.contains(np.stack([xs, np.full_like(xs, y)], axis=-1))
            if inside.any():
                return np.array([np.median(xs[inside]), y])
        raise ValueError("the polygon is too thin to find a point inside it")

    def __repr__(self):
        return f"Polygon({len(self.vertices)} vertices, bounds {self.bounds.tolist()})"


def as_window(window):
    """A :class:`Window`, or an array-like ``(d, 2)`` of bounds turned into a :class:`Rectangle`."""
    return window if isinstance(window, Window) else Rectangle(window)


# ---------------------------------------------------------------- rules


def _per_dim(num_points, dim, name):
    counts = (num_points,) * dim if np.isscalar(num_points) else tuple(num_points)
    if len(counts) != dim:
        raise ValueError(f"{name} needs one count per dimension ({dim}), got {num_points!r}")
    return tuple(positive_int(c, name) for c in counts)


def _box(window, rule):
    if not isinstance(window, (Rectangle, Polygon)):
        raise TypeError(f"{type(rule).__name__} needs a Rectangle, Interval or Polygon window, got {type(window).__name__}")
    return window.bounds


class GaussLegendre(Rule):
    """Tensor-product Gauss-Legendre rule; exact for polynomials of degree < 2 n per dimension.

    Args:
        num_points: nodes per dimension (an int, or one per dimension).
    """

    def __init__(self, num_points=32):
        self.num_points = num_points if np.isscalar(num_points) else tuple(num_points)
        _per_dim(self.num_points, 1 if np.isscalar(num_points) else len(self.num_points), "num_points")

    def layout(self, window):
        bounds = _box(window, self)
        axes_x, axes_w = [], []
        for (lo, hi), n in zip(bounds, _per_dim(self.num_points, window.dim, "num_points")):
            x, w = np.polynomial.legendre.leggauss(n)
            axes_x.append(lo + (x + 1) * (hi - lo) / 2)
            axes_w.append(w * (hi - lo) / 2)
        points = np.stack([g.ravel() for g in np.meshgrid(*axes_x, indexing="ij")], axis=-1)
        weights = math.prod(np.meshgrid(*axes_w, indexing="ij")).ravel()
        return Layout(points, weights)


class _Cells(Rule):
    def __init__(self, num_points=32):
        self.num_points = num_points if np.isscalar(num_points) else tuple(num_points)
        _per_dim(self.num_points, 1 if np.isscalar(num_points) else len(self.num_points), "num_points")

    def layout(self, window):
        bounds = _box(window, self)
        shape = _per_dim(self.num_points, window.dim, "num_points")
        widths = (bounds[:, 1] - bounds[:, 0]) / np.array(shape)
        index = np.stack([g.ravel() for g in np.meshgrid(*[np.arange(n) for n in shape], indexing="ij")], axis=-1)
        corners = bounds[:, 0] + index * widths
        strides = np.array([math.prod(shape[k + 1:]) for k in range(len(shape))], dtype=np.int64)
        return Layout(corners, np.full(len(corners), float(np.prod(widths))), widths, bounds[:, 0].copy(), strides, shape)


class StratifiedMC(_Cells):
    """Randomised stratified Monte Carlo: one uniform point per cell of an equal grid, redrawn
    at every evaluation; unbiased for ``int_W g``.

    Args:
        num_points: cells per dimension (an int, or one per dimension).
    """

    random = True

    def nodes(self, points, widths, uniform=None):
        """One uniform point per cell (``points`` are the cells' lower corners), or the cells'
        midpoints without draws."""
        return points + (widths / 2 if uniform is None else uniform * widths)

    def spacing(self, layout, window):
        return None


class Binned(_Cells):
    """Binned counts: a Poisson per cell of an equal grid, ``count ~ Poisson(|cell| lambda(centre))``.

    Args:
        num_points: cells per dimension (an int, or one per dimension).
    """

    def layout(self, window):
        """The cells' centres (one node each) and areas."""
        if isinstance(window, Polygon):
            raise TypeError("Binned counts need a Rectangle window: a cell cut by a Polygon's border has no single "
                            "area; use StratifiedMC (the default) or a raster's PixelRule")
        layout = super().layout(window)
        return layout._replace(points=layout.points + layout.widths / 2)

    def spacing(self, layout, window):
        return None


def as_rule(integration, window):
    """The rule to use: ``integration``, or by default a randomised one (:class:`StratifiedMC`
    with 64 cells in 1-D, 32 per dimension otherwise; a :class:`UserRule` window is its own):
    fresh nodes at every step leave the optimiser no gap between fixed nodes to hide intensity in."""
    own = window.own_rule()
    if integration is None:
        return own if own is not None else StratifiedMC(64 if window.dim == 1 else 32)
    if own is not None and integration is not own:
        raise ValueError("a UserRule window is its own integration rule: pass integration=None")
    if not isinstance(integration, Rule):
        raise TypeError(f"integration must be an integration rule (GaussLegendre, StratifiedMC, Binned), "
                        f"got {type(integration).__name__}")
    return integration


def node_spacing(layout, window):
    """The spacing ``(d,)`` of a fixed rule's nodes: the widest gap between neighbouring node
    coordinates per dimension on a tensor grid, else ``(|W| / P)^(1/d)``."""
    points = layout.points
    coords = [np.unique(points[:, k]) for k in range(points.shape[1])]
    if math.prod(len(c) for c in coords) == len(points) and all(len(c) > 1 for c in coords):
        return np.array([np.diff(c).max() for c in coords])
    return np.full(points.shape[1], (window.volume / len(points)) ** (1 / points.shape[1]))


def check_events(events, window):
    """Raise a ValueError when a (concrete, NumPy) pattern is empty or has events outside ``window``."""
    if events.shape[0] == 0:
        raise ValueError("events is empty: a Cox process needs at least one event")
    outside = ~window.contains(events)
    if outside.any():
        raise ValueError(f"events has {int(outside.sum())} event(s) outside the window {window!r}, "
                         f"e.g. {events[outside][0].tolist()}")


# ---------------------------------------------------------------- simulation by thinning


def anchor_points(window, num_points):
    """About ``num_points`` points on a regular grid over the window's bounding box (cell
    centres, per-dimension counts proportional to the box's sides), those inside the window (or,
    where none is, one inside point): ``(R, d)`` NumPy float64, ``1 <= R <= num_points``. Where
    :meth:`~sparsegp_common.objectives.cox.CoxProcess.simulate` draws ``f`` jointly before drawing it at the
    candidates given those values."""
    num_points = positive_int(num_points, "num_points")
    box = window.bounds
    sides = box[:, 1] - box[:, 0]
    wide = sides > 0  # a UserRule's box may be flat in a dimension
    shape = np.ones(len(sides), dtype=int)
    if wide.any():
        scale = (num_points / np.prod(sides[wide])) ** (1 / wide.sum())  # points per unit length
        shape[wide] = np.maximum(np.floor(sides[wide] * scale * (1 + 1e-9)), 1)
    while np.prod(shape) > num_points:  # flooring can still overshoot when a side gets the minimum 1
        shape[np.argmax(shape)] -= 1
    axes = [lo + (np.arange(n) + 0.5) * (hi - lo) / n for (lo, hi), n in zip(box, shape)]
    points = np.stack([g.ravel() for g in np.meshgrid(*axes, indexing="ij")], axis=-1)
    points = points[window.contains(points)]
    if len(points) == 0:  # a window thinner than the grid's spacing: one inside point
        points = np.array(getattr(window, "anchor", box.mean(axis=1)), dtype=np.float64)[None]
    return points


def thin(window, log_bound, draw_log_intensity, rng, max_tries=10):
    """One pattern of a Poisson process by thinning, given draws of its log-intensity.

    Candidates are a homogeneous process of rate ``exp(log_bound)`` on the window's bounding box
    (kept when inside the window); each is accepted with probability ``lambda(x) / bound``: exact
    where the bound dominates ``lambda``. A draw whose intensity exceeds the bound at a candidate
    is redrawn with the bound doubled (an excess where no candidate falls goes unseen, so the
    first bound should dominate: :meth:`~sparsegp_common.objectives.cox.CoxProcess.simulate`
    takes the mean plus 5 standard deviations of ``log lambda``).

    Args:
        window: the :class:`Window`.
        log_bound: log of the first dominating rate.
        draw_log_intensity: ``fn(candidates (C, d), seed) -> (C,)`` NumPy log-intensity of one
            draw at the candidates (for a Cox process, :class:`~sparsegp_common.inference.cox_simulation.AnchoredDraws`).
        rng: a ``numpy.random.Generator``.

    Returns:
        The accepted events ``(n, d)`` (NumPy float64).
    """
    box = window.bounds
    box_volume = float(np.prod(box[:, 1] - box[:, 0]))
    for _ in range(max_tries):
        count = rng.poisson(math.exp(log_bound) * box_volume)
        candidates = box[:, 0] + rng.uniform(size=(count, window.dim)) * (box[:, 1] - box[:, 0])
        candidates = candidates[window.contains(candidates)]
        if len(candidates) == 0:
            return candidates
        log_lam = np.asarray(draw_log_intensity(candidates, int(rng.integers(2**31))), dtype=np.float64)
        if np.all(log_lam <= log_bound):
            return candidates[np.log(rng.uniform(size=len(candidates))) < log_lam - log_bound]
        log_bound += math.log(2.0)
    raise RuntimeError(f"thinning: the intensity kept exceeding its bound after {max_tries} doublings")
