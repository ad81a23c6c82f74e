"""Backend-independent helpers shared by ``pyro_sparsegp`` and ``numpyro_sparsegp``.

Only plain Python and NumPy live here: multiple dispatch, quadrature nodes and the texts of
error messages, so that both backends raise the same advice.
"""
