"""The backend-free core of ``pyro_sparsegp`` and ``numpyro_sparsegp``: every formula written once
against the array API standard, with a small op set per array library (see ``docs/design.md``)."""
