"""What the core's objectives need from NumPyro: sample sites, plates, scaling, bound parameters
and the random key (``numpyro.prng_key()`` unless one is given)."""
import contextlib

import numpyro
from numpyro import handlers
from numpyro.primitives import _PYRO_STACK, Messenger

from .compiled import compiled  # noqa: F401 (eager formulas as one program)

sample, factor, scale = numpyro.sample, numpyro.factor, handlers.scale


def plate(name, size, subsample_size=None, like=None):
    """A data plate on the last batch dimension (``like`` is for the Pyro signature)."""
    return numpyro.plate(name, size, subsample_size=subsample_size, dim=-1)


def inside(name):
    """Whether the plate ``name`` is active."""
    return any(isinstance(frame, numpyro.plate) and frame.name == name for frame in _PYRO_STACK)


@contextlib.contextmanager
def bound(*objects, hyperpriors=False):
    """The objects with their parameters read from ``numpyro.param`` sites (``bind()``);
    ``hyperpriors`` changes nothing here (a NumPyro user substitutes a draw of their own model for
    a parameter)."""
    yield tuple(obj.bind() for obj in objects)


def draws():
    """Whether random estimates are drawn here: under a ``seed`` handler (as in SVI);
    evaluated directly, estimators that can be exact are."""
    return any(isinstance(frame, handlers.seed) for frame in _PYRO_STACK)


def key(key):
    """The key random draws use: ``key``, else ``numpyro.prng_key()`` (under a seed handler)."""
    if key is None:
        if not draws():
            raise ValueError("random draws need `key` or a numpyro seed handler")
        key = numpyro.prng_key()
    return key


def draw(distribution, key):
    """One draw from a distribution of this PPL (``key`` from :func:`key`)."""
    return distribution.sample(key)


class AsksForKey(Exception):
    """Raised by :func:`refusing_keys`."""


class refusing_keys(Messenger):
    """Runs ``fn`` but raises :class:`AsksForKey` where it calls ``numpyro.prng_key()``: an
    autoguide does so first thing on its first call, to set itself up from values (which a traced
    run does not have), before it changes anything."""

    def process_message(self, msg):
        if msg["type"] == "prng_key":
            raise AsksForKey
