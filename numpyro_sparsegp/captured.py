"""``fit``'s compiled step, the twin of :mod:`pyro_sparsegp.captured`: in NumPyro the SVI update
is always one ``jax.jit`` program (JAX traces it once per shape of the batch; nothing needs
recording by hand)."""
import jax


def compiled_update(update, compiled, donate=False):
    """``jax.jit(update)`` for ``fit(compiled=None or True)``; ``compiled=False`` is refused.
    ``donate``: the state (the first argument) is donated, so that updates of a few rows of large
    arrays happen in place."""
    if compiled is False:
        raise ValueError("compiled=False: NumPyro's fit always runs its step as one jax.jit program; to step "
                         "through it eagerly, call fit inside `with jax.disable_jit():`")
    return jax.jit(update, donate_argnums=(0,) if donate else ())
