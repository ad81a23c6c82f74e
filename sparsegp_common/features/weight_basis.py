"""What the weight-space bases read by index share (random Fourier features and kernel functions at
inputs, the bases of :class:`~sparsegp_common.priors.qsgp.QSGP`): a kernel whose lengthscale and
variance they read at every call, unless held at given values."""
import copy

__all__ = ["WeightBasis"]


class WeightBasis:
    """Base of the weight-space bases: ``self.kernel``'s lengthscale and variance, or the values
    held by :meth:`fixed`."""

    hyperparameters = None

    def fixed(self, lengthscale, variance):
        """The same basis with ``lengthscale`` and ``variance`` held at the given values instead of
        the kernel's (e.g. the control variates' support features, Evans and Nair, 2020, App. F.3)."""
        basis = copy.copy(self)
        basis.hyperparameters = (lengthscale, variance)
        return basis

    def at(self, X):
        """The basis for reading the features of the inputs ``X`` in blocks of functions (this
        one: its features cost the same one block at a time)."""
        return self

    def held(self):
        """The same basis with the kernel's current hyperparameters held (read once, here)."""
        return self.fixed(*self._lengthscale_and_variance())

    def _lengthscale_and_variance(self):
        return self.hyperparameters or (self.kernel.lengthscale, self.kernel.variance)
