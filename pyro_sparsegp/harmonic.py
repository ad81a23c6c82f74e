"""Harmonic kernel decomposition (Sun, Shi, Wilson & Grosse, ICML 2021; the formulas are
:mod:`sparsegp_common.features.harmonic`): transformation groups and the inter-domain features of
the components, for ``SVGP(kernel, HarmonicFeatures(Z, transformation))``."""
from sparsegp_common.features import harmonic as core
from sparsegp_common.features.harmonic import *  # noqa: F403  (its __all__)

from . import features  # noqa: F401  (Features adapted before its subclass)
from .params import adapt

__all__ = ["HarmonicFeatures", *core.__all__]

(HarmonicFeatures,) = adapt((core.HarmonicFeatures,), module=__name__)
