"""A crash and a resume, as a killed training job sees them."""
import pytest


def crash_and_resume(run, tmp_path, stop_at, every):
    """``run(**fit_options)`` killed at step ``stop_at`` (a ``KeyboardInterrupt`` from a callback)
    with a checkpoint every ``every`` steps, then run again with ``resume=True``: what the resumed
    run returns."""
    def crash(state):
        if state.step == stop_at:
            raise KeyboardInterrupt

    path = str(tmp_path / "ckpt")
    with pytest.raises(KeyboardInterrupt):
        run(checkpoint=path, checkpoint_every=every, callbacks=crash)
    return run(checkpoint=path, checkpoint_every=every, resume=True)
