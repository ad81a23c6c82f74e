"""Input validation: clear ``TypeError``/``ValueError`` messages that name the argument."""
import torch

from sparsegp_common.checks import ArrayChecks, one_of, positive_int, probabilities  # noqa: F401  (re-exported)
from sparsegp_common.ops import _torch as ops


def as_tensor(value, name, like=None):
    """Convert an array-like to a floating tensor (dtype/device of ``like`` when given)."""
    if isinstance(value, torch.Tensor):
        tensor = value
    else:
        try:
            kwargs = {} if like is None else {"dtype": like.dtype, "device": like.device}
            tensor = torch.as_tensor(value, **kwargs)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"{name} must be a tensor or array-like of numbers, got {type(value).__name__}") from e
    if tensor.dtype == torch.bool or tensor.is_complex():
        raise TypeError(f"{name} must be real-valued, got dtype {tensor.dtype}")
    if like is not None:
        return tensor.to(dtype=like.dtype, device=like.device)
    if not tensor.is_floating_point():
        tensor = tensor.to(torch.get_default_dtype())
    return tensor


as_array = as_tensor  # the name the backend-free core uses


def host(tensor):
    """``tensor`` as a NumPy array (detached, copied from the GPU)."""
    return tensor.detach().cpu().numpy()


def all_true(predicate, tensor):
    """``predicate(tensor).all()`` as a Python bool (True while a graph is captured: ``fit`` checks
    all of its data before)."""
    return not ops.is_concrete(tensor) or bool(predicate(tensor).all())


finite, positive, inputs, observations, integer_valued, require = ArrayChecks(as_array, all_true, host).functions()
