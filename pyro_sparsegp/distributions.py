"""An observation distribution scored by the expected log-likelihood under q(f) (see
:mod:`sparsegp_common.likelihoods.distributions`), as a Pyro distribution."""
import torch
from pyro.distributions import TorchDistribution

from sparsegp_common.likelihoods import distributions as core


class ExpectedLikelihood(core.ExpectedLikelihood, TorchDistribution):
    def sample(self, sample_shape=torch.Size()):
        with torch.no_grad():
            return self._draw(None, sample_shape)
