"""An observation distribution scored by the expected log-likelihood under q(f) (see
:mod:`sparsegp_common.likelihoods.distributions`), as a NumPyro distribution."""
from numpyro.distributions import Distribution

from sparsegp_common.likelihoods import distributions as core


class ExpectedLikelihood(core.ExpectedLikelihood, Distribution):
    def sample(self, key, sample_shape=()):
        return self._draw(key, sample_shape)
