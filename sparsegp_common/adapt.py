"""Backend classes from core classes: each core class mixed with a backend's parameter base.

The core writes a class once (its formulas and docstring, parameters declared through
``self._param``); each backend gets the same class with its own parameter handling by
:func:`adapt`, which keeps the core hierarchy: the backend ``Matern52`` subclasses the backend
``Matern`` and ``Stationary`` as well as the core ``Matern52``, so ``isinstance`` and the
``Kuu``/``Kuf`` dispatch on core types see every backend object.
"""
import inspect


def _core_base(cls):
    """The first base written in the core (other than the mixins here)."""
    return next((b for b in cls.__bases__ if b.__module__.split(".")[0] == __package__ and b.__module__ != __name__), None)


class Documented:
    """A class documented once: a subclass whose first core base is ``C`` (a backend's class,
    ``class GPModel(core.GPModel, torch.nn.Module)``) takes ``C``'s docstring when it has none
    of its own (class docstrings are not inherited), as do the methods it overrides."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        core = _core_base(cls)
        if core is None:
            return
        if cls.__dict__.get("__doc__") is None:
            cls.__doc__ = core.__doc__
        for name, member in vars(cls).items():
            if inspect.isfunction(member) and member.__doc__ is None:
                member.__doc__ = getattr(getattr(core, name, None), "__doc__", None)


class Adapted(Documented):
    """Mixin of each backend's parameter base. A backend class whose first core base is ``C``
    (made by :func:`adapt` or written by hand, ``class Kernel(core.Kernel, Parameterized)``) is
    recorded as the backend's ``C`` in ``_adapted`` (a dict the backend base defines), so that
    :func:`adapt` builds its children on it and core code builds backend objects (``k1 + k2``)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        core = _core_base(cls)
        if core is not None:
            cls._adapted[core] = cls


def adapt(core_classes, base, module):
    """Backend versions of ``core_classes`` (parents listed before children), as a tuple; a
    parent the backend wrote by hand is used where :class:`Adapted` recorded it.

    Args:
        core_classes: core classes to adapt.
        base: the backend's parameter base class (used where a class has no adapted parent).
        module: ``__name__`` of the backend module that exports them (for docs and repr).
    """
    made = []
    for cls in core_classes:
        parents = tuple(base._adapted[b] for b in cls.__bases__ if b in base._adapted) or (base,)
        namespace = {"__module__": module, "__qualname__": cls.__name__, "__doc__": cls.__doc__}
        made.append(type(base)(cls.__name__, (cls, *parents), namespace))
    return tuple(made)
