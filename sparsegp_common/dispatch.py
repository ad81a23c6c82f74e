"""A small multiple-dispatch registry, as GPflow uses for ``Kuu``/``Kuf``.

A function is registered for a tuple of types; a call picks the first registration found by
walking the method resolution orders of the argument types (first argument outermost), so a
specific (features, kernel) pair overrides a generic one.
"""
import itertools


class Dispatcher:
    def __init__(self, name):
        self.name = name
        self._registry = {}

    def register(self, *types):
        def decorator(fn):
            self._registry[types] = fn
            return fn

        return decorator

    def __call__(self, *args, **kwargs):
        n = max(len(t) for t in self._registry)
        mros = [type(a).__mro__ for a in args[:n]]
        for types in itertools.product(*mros):
            fn = self._registry.get(types)
            if fn is not None:
                return fn(*args, **kwargs)
        names = ", ".join(type(a).__name__ for a in args[:n])
        raise TypeError(f"{self.name} is not implemented for ({names})")
