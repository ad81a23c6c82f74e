"""The suite's own compile settings (``conftest.py``): tests about float32 round-off compile as
users' programs do, the rest cheaply."""
import jax
import pytest
from jax._src import compiler

from backends import LEGACY_EMITTERS, legacy_emitters_where_unoptimised, xla_optimisations


def overrides():
    return dict(compiler.get_compile_options(1, 1).env_option_overrides)


def test_only_unoptimised_programs_take_the_older_emitters():
    if not legacy_emitters_where_unoptimised.applied:
        pytest.skip("this jaxlib has one set of emitters")
    assert jax.config.values["jax_disable_most_optimizations"]
    assert overrides() == {LEGACY_EMITTERS: False}
    with xla_optimisations(True):  # what the float32 tests run under
        assert overrides() == {}
