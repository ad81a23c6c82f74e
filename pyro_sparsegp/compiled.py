"""``compiled(fn, *args)``: ``fn(*args)``. torch runs each operation as it comes, without
compiling it first, so there is nothing to gather (the NumPyro twin runs eager formulas as one
``jax.jit`` program)."""


def compiled(fn, *args):
    return fn(*args)
