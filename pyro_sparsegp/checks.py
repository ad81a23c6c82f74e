"""Input validation: clear ``TypeError``/``ValueError`` messages that name the argument."""
import torch

from sparsegp_common.checks import one_of, positive_int, probabilities  # noqa: F401  (re-exported)


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


def finite(tensor, name):
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError(f"{name} contains NaN or inf")
    return tensor


def positive(value, name, like=None):
    """A hyperparameter that must be strictly positive (and finite)."""
    tensor = finite(as_tensor(value, name, like), name)
    if not bool((tensor > 0).all()):
        raise ValueError(f"{name} must be positive, got {tensor.detach().cpu().numpy()}")
    return tensor


def inputs(X, name="X", input_dim=None, values=True):
    """Inputs as an (N, D) tensor; 1-D inputs are read as (N, 1); NaN/inf is an error
    unless ``values=False`` (shape only: the caller checks the rows it uses)."""
    X = as_tensor(X, name)
    if values:
        finite(X, name)
    if X.dim() == 1:
        X = X.unsqueeze(-1)
    if X.dim() != 2:
        raise ValueError(f"{name} must have shape (N, D), got {tuple(X.shape)}")
    if input_dim is not None and X.shape[-1] != input_dim:
        raise ValueError(f"{name} has {X.shape[-1]} input dimensions but the model expects {input_dim}")
    return X


def same_length(y, n, name="y", other="X"):
    if y.shape[0] != n:
        raise ValueError(f"{name} has length {y.shape[0]} but {other} has {n} rows")
    return y


def integer_valued(y, name):
    if not bool((y == torch.round(y)).all()):
        raise ValueError(f"{name} must hold integers")
    return y


as_array = as_tensor  # the name the backend-free core uses


def host(tensor):
    """``tensor`` as a NumPy array (detached, copied from the GPU)."""
    return tensor.detach().cpu().numpy()


def all_true(predicate, tensor):
    """``predicate(tensor).all()`` as a Python bool."""
    return bool(predicate(tensor).all())
