"""What the quadruply stochastic GP tutorials (``qsgp_*.py``) take from their backend: the library,
float32 arrays, the options of the AdaGrad group on the variational tables, and arrays back to
NumPy. Imported by those scripts (it sits beside them); it runs nothing itself."""
import numpy as np


def setup(backend):
    """``(library, array, AdaGrad group options, numpy)`` of ``backend`` (``"pyro"`` or ``"numpyro"``)."""
    if backend == "pyro":
        import torch

        import pyro_sparsegp as lib

        return (lib, lambda a: torch.as_tensor(np.asarray(a), dtype=torch.float32),
                {"optimizer": torch.optim.Adagrad}, lambda a: a.detach().numpy())
    import jax.numpy as jnp
    import numpyro

    import numpyro_sparsegp as lib

    return (lib, lambda a: jnp.asarray(np.asarray(a), dtype=jnp.float32),
            {"optimizer": numpyro.optim.Adagrad, "momentum": 0.0}, np.asarray)
