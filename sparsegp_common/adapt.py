"""Backend classes from core classes: each core class mixed with a backend's parameter base.

The core writes a class once (its formulas and docstring, parameters declared through
``self._param``); each backend gets the same class with its own parameter handling by
:func:`adapt`, which keeps the core hierarchy: the backend ``Matern52`` subclasses the backend
``Matern`` and ``Stationary`` as well as the core ``Matern52``, so ``isinstance`` and the
``Kuu``/``Kuf`` dispatch on core types see every backend object.
"""


def adapt(core_classes, base, module, known=None):
    """Backend versions of ``core_classes`` (parents listed before children), as a tuple.

    ``base._adapted`` (a dict the backend base defines) records them by core class.

    Args:
        core_classes: core classes to adapt.
        base: the backend's parameter base class (used where a class has no adapted parent).
        module: ``__name__`` of the backend module that exports them (for docs and repr).
        known: ``{core class: backend class}`` for parents the backend wrote by hand.
    """
    made = dict(known or {})
    for cls in core_classes:
        parents = tuple(made[b] for b in cls.__bases__ if b in made) or (base,)
        namespace = {"__module__": module, "__qualname__": cls.__name__, "__doc__": cls.__doc__}
        made[cls] = type(base)(cls.__name__, (cls, *parents), namespace)
    base._adapted.update(made)  # so that core code can build backend objects (``k1 + k2``)
    return tuple(made[cls] for cls in core_classes)
