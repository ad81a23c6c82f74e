"""What a backend provides to the core, in one place.

A backend package (``pyro_sparsegp``, ``numpyro_sparsegp``) gives the core two things:

* **Hooks**: class attributes that core classes read as ``self._<hook>``, set on the backend's
  parameter base or on the backend's own version of a class (see :mod:`sparsegp_common.adapt`).
  :data:`HOOKS` lists each with what it must be.
* **Array operations** the array API standard lacks, one module per array library under
  :mod:`sparsegp_common.ops` (chosen by the arrays passed): :data:`OPS`.

``tests/test_contract.py`` checks both: every hook a core class reads is set in both backends'
versions of that class, every hook listed is read somewhere, and every operations module has
every operation.
"""

HOOKS = {
    # the parameter base (every class with parameters)
    "_adapted": "dict from a core class to the backend's version of it (filled by `adapt`)",
    "_param": "method `(name, value, constraint='real')`: declare a learnable parameter",
    "_follow": "method `(like)`: cast every parameter to the dtype (and device) of the array `like`",
    # modules and classes of the PPL
    "_checks": "module of input checks (`inputs`, `finite`, `observations`, `require`, ...): the backend's `checks`",
    "_sites": "module of sample sites, factors, plates, RNG keys and parameter binding: the backend's `sites`",
    "_dist": "the PPL's distributions module (`Normal`, `MultivariateNormal`, ...)",
    "_predict": "module with `predict_f`, `predict_y`, `sample_f` and `inspect`: the backend's `predict`",
    "_expected_likelihood": "distribution class scoring `y` by `E_q[log p(y | f)]` (GPModel's observed site)",
    "_cox_events": "distribution class of a Cox process's events given their log-intensities",
    "_gaussian": "the backend's `Gaussian` likelihood class (the collapsed orthogonal-features bound)",
    # the deep-basis-kernel models and their networks
    "_map_rows": "method `(fn, X, batch_size, params, *extra)`: `fn` over blocks of rows of `X`, results joined",
    "_network": "`(type, description)` of the networks the models accept (torch.nn.Module, equinox Module)",
    "_net_like": "static method `(net)`: an array whose dtype and device the model follows",
    "_parameter_values": "method `(params)`: the model's parameter values, `{name: array}`",
    "_as_array": "static function `(x, like=None)`: `x` as the backend's array",
    "_linears": "static method `(sizes, dtype, seed)`: the dense layers of a network",
    "_sequence": "the container the networks keep their layers in (`torch.nn.ModuleList`, `list`)",
}

OPS = {
    "solve_lower": "`(L, B, transpose)`: `L^{-1} B` or `L^{-T} B` for lower-triangular `L`",
    "cholesky": "`(A, levels, message, dtype)`: lower factor of `A + jitter I` computed in `dtype` (returned in `A`'s), trying each jitter level in turn",
    "precise_matmul": "`(a, b)`: a product at full float32 precision (no TF32)",
    "is_concrete": "`(x)`: whether `x` has values (not a tracer)",
    "normal": "`(key, shape, like)`: standard normal draws in the dtype and device of `like`",
    "stop_gradient": "`(x)`: `x` without a derivative",
    "split": "`(key, n)`: `n` independent keys",
    "uniform": "`(key, shape, dtype, device)`: uniform draws on [0, 1)",
    "permutation": "`(key, n, device)`: a random permutation of `0..n-1`",
    "randint": "`(key, shape, high, device)`: uniform integers in `[0, high)`",
    "blockwise_sum": "`(block, size, chunk, like)`: `sum_j block(rows_j, weights_j)`, each block recomputed backwards",
    "index_add": "`(x, index, values)`: `x` with `values` added at the rows `index` (repeats accumulate)",
    "categorical": "`(key, logits, shape)`: draws of category indices",
    "bincount": "`(index, length, dtype)`: counts per index",
    "recurrence": "`(step, first, second, coefficients, count)`: a three-term recurrence, stacked",
    "wide": "`(x, like)`: `x` in the accumulating dtype (float64 where available)",
    "cast_like": "`(x, like)`: `x` in the dtype of `like`",
    "from_host": "`(x, like)`: the NumPy array `x` as a new array in the dtype and on the device of `like`, without device programs",
    "dbk_moments": "`(Phi, y, s)`: the deep-basis-kernel moments accumulated in float64",
    "cos": "`(x)`: elementwise (JAX on a CPU in float32: by polynomial, several times faster than XLA's)",
    "sin": "`(x)`: elementwise, as `cos`",
    "softplus": "`(x)`", "lgamma": "`(x)`", "ndtr": "`(x)`", "ndtri": "`(p)`", "log_ndtr": "`(x)`",
    "logsumexp": "`(x, axis)`", "softmax": "`(x, axis)`",
    "quantile": "`(x, q, axis, method)`",
    "as_index": "`(x)`: an integer index array",
    "when_any": "`(flags, if_any, otherwise)`: a branch taken on data, traceable",
    "host_callback": "`(fn)`: `fn` run on the host with concrete values (inside compiled code too)",
    "on_host": "`(fn, shape, like, *arrays)`: `fn`'s NumPy result of the arrays' values, computed on the host (inside compiled code too), in the dtype and on the device of `like`",
}
