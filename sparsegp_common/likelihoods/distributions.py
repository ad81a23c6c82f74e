"""An observation distribution scored by the expected log-likelihood under q(f)."""
from sparsegp_common.adapt import Documented
from sparsegp_common.ops import backend, namespace


class ExpectedLikelihood(Documented):
    """Observations ``y`` whose ``log_prob`` is ``E_q[log p(y | f)]`` with ``q(f) = N(f_loc, f_var)``.

    Used as the observed site of ``GPModel``, it turns the PPL's ELBO into the uncollapsed SVGP
    bound of Hensman et al. with a closed-form or quadrature data term; ``sample()`` draws
    ``f ~ q(f)`` and then ``y ~ p(y | f)``, i.e. the posterior predictive. Shapes:
    ``f_loc``/``f_var`` are ``(N,)`` (``(N, C)`` for multi-latent likelihoods). With NumPyro
    ``likelihood`` must be bound (``likelihood.bind()``). Given ``obs``, its log-density is
    computed at construction, inside the model, so that the likelihood's parameters are read
    (and registered) there, as other distributions capture theirs.

    The backends mix this class with their distribution base class.
    """

    arg_constraints = {}

    def __init__(self, likelihood, f_loc, f_var, obs=None, validate_args=None):
        self.likelihood, self.f_loc, self.f_var = likelihood, f_loc, f_var
        self._obs = obs
        self._obs_log_prob = None if obs is None else likelihood.expected_log_prob(obs, f_loc, f_var)
        batch_shape = f_loc.shape if likelihood.num_latent is None else f_loc.shape[:-1]
        super().__init__(batch_shape, type(batch_shape)(), validate_args=validate_args)

    @property
    def support(self):
        return self.likelihood.support

    def log_prob(self, value):
        if value is self._obs:
            return self._obs_log_prob
        return self.likelihood.expected_log_prob(value, self.f_loc, self.f_var)

    def _draw(self, key, sample_shape):
        """``y ~ p(y | f)`` with ``f ~ q(f)``, from ``key`` (see :mod:`sparsegp_common.likelihoods`)."""
        xp, ops = namespace(self.f_loc, self.f_var), backend(self.f_loc, self.f_var)
        key_f, key_y = ops.split(key, 2)
        eps = ops.normal(key_f, tuple(sample_shape) + tuple(self.f_loc.shape), self.f_loc)
        f = self.f_loc + xp.sqrt(self.f_var) * eps
        return self.likelihood._sites.draw(self.likelihood(f), key_y)
