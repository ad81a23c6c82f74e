"""What the core's objectives need from Pyro: sample sites, plates, scaling, parameter contexts
and the random key (torch's global RNG, so ``key`` stays None)."""
import contextlib

import pyro
from pyro import poutine
from pyro.poutine.runtime import am_i_wrapped, get_plates

from .compiled import compiled  # noqa: F401 (eager formulas: nothing to compile in torch)

sample, factor, scale = pyro.sample, pyro.factor, poutine.scale


def plate(name, size, subsample_size=None, like=None):
    """A data plate on the last batch dimension, on the device of ``like``."""
    return pyro.plate(name, size, subsample_size=subsample_size, dim=-1, device=None if like is None else like.device)


def inside(name):
    """Whether the plate ``name`` is active."""
    return any(frame.name == name for frame in get_plates())


@contextlib.contextmanager
def active(*modules):
    """The modules' parameter reads are ``param`` messages while inside, as in ``pyro_method``."""
    with contextlib.ExitStack() as stack:
        for module in modules:
            stack.enter_context(module._pyro_context)
        yield


@contextlib.contextmanager
def bound(*modules, hyperpriors=False):
    """The modules with their parameters registered and readable (:func:`active`). With
    ``hyperpriors``, their ``PyroSample`` attributes are drawn here, outside the data plate the
    caller enters next (a component whose model reads its kernel only inside the plate, as a
    whitened prior variance does, would otherwise draw a hyperparameter per data point)."""
    with active(*modules):
        for module in modules if hyperpriors else ():
            for part in module.modules():
                for name in part.__dict__.get("_pyro_samples", ()):
                    getattr(part, name)
        yield modules


def draws():
    """Whether random estimates are drawn here: during inference (inside any Pyro handler,
    e.g. SVI's trace); evaluated directly, estimators that can be exact are."""
    return am_i_wrapped()


def key(key):
    """The key random draws use: None, torch's global RNG (seed it with ``pyro.set_rng_seed``)."""
    if key is not None:
        raise TypeError("the Pyro backend draws from torch's global RNG (seed it with pyro.set_rng_seed); "
                        f"key must be None, got {type(key).__name__}")
    return None


def draw(distribution, key):
    """One draw from a distribution of this PPL (``key`` from :func:`key`)."""
    return distribution.sample()
