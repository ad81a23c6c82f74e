"""Error texts shared by both backends."""


def cholesky_failed(shape, dtype, jitter):
    double = "float64" in str(dtype)
    return (
        f"Cholesky factorisation of a {tuple(shape)} matrix in {dtype} failed even after "
        f"adding jitter {jitter:.1e} to its diagonal: the matrix is not numerically positive "
        "definite. Things to try: "
        + ("" if double else "factorise in double precision (cholesky_dtype='float64', or train in float64); ")
        + "standardise the inputs X; remove duplicate or near-duplicate inducing points; raise `jitter`; "
        "lower the learning rate (NaN hyperparameters also end here)."
    )


def loss_ran_away(step, value, best):
    return (
        f"fit stopped: the loss ran away to {value:.4g} at step {step} (the best so far was {best:.4g}), so "
        "the optimiser is diverging. Things to try: a lower learning rate (lr, or lr_schedule with a "
        "warm-up); for a Cox process, the default randomised integration rule (a fixed rule lets the "
        "intensity grow between its nodes once a lengthscale falls below their spacing); standardise "
        "the inputs X. With checkpoint=... the last checkpoint before the failure is kept."
    )


def loss_not_finite(step, value):
    return (
        f"fit stopped: the loss became {value} at step {step}, so the parameters are no longer "
        "usable. Things to try: a lower learning rate (lr, or lr_schedule with a warm-up); train in "
        "float64, or SVGP(cholesky_dtype='float64'); standardise the inputs X and remove "
        "near-duplicate inducing points; raise the jitter. With checkpoint=... the last checkpoint "
        "before the failure is kept and resume=True continues from it."
    )


def gradient_not_finite(step, norm):
    return (
        f"fit stopped: the gradient became {norm} at step {step} while the loss was finite, so the "
        "next update would make the parameters unusable. Things to try: train in float64, or "
        "SVGP(cholesky_dtype='float64'); raise the jitter; standardise the inputs X and "
        "remove near-duplicate inducing points; a lower learning rate."
    )


def gradient_spiked(step, norm, median):
    return (
        f"fit stopped: the gradient norm jumped to {norm:.3g} at step {step}, {norm / median:.2g} times "
        f"the median {median:.3g} of the steps before. After such a step Adam's second-moment "
        "estimate is swamped and every parameter stays frozen for thousands of steps, while the loss "
        "looks calm. It is usually round-off, or inducing inputs Z that nearly coincide: train in float64 "
        "(or SVGP(cholesky_dtype='float64')), raise the jitter, standardise the inputs X, spread Z out; or "
        "lower the learning rate. With checkpoint=... the last checkpoint before it is kept and resume=True continues "
        "from it."
    )
