"""A checkpointed ``HDF5Collector(path)`` run that raises inside ``jax.jit``, retried at once in the same process
with a new collector (a retry loop, a notebook cell run again) that the caller made anew, the failed one dropped: the
retry takes the file over from it, every time, and continues from the last checkpoint, whatever the failed run's
writes still queued; a failed collector that the caller still holds may still be running, and is refused.

The retries run in a process of their own: pytest's capture of the logs keeps the frames of a callback that failed,
and with them the collector, as a caller that holds it would."""

from __future__ import annotations

import os
import sys
import textwrap

import forked
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow.errors import CheckpointError

STEPS = 40


def _run(
    path: str, fail_at: int | None, held: list[io.HDF5Collector] | None = None, *, cycle: bool = False
) -> np.ndarray:
    """Run a chain ``x <- x / 2 + t`` for STEPS steps, checkpointed every 5, from the collector's checkpoint if any;
    the callback of step ``fail_at`` raises. ``held``: where the caller keeps the collector, if it does;
    ``cycle``: the failure is kept in a local of this frame, which its traceback holds (a reference cycle)."""

    def fail(t: np.ndarray) -> None:
        if t == fail_at:
            raise RuntimeError("the sampler's callback failed")

    collector = io.HDF5Collector(path)
    if held is not None:
        held.append(collector)
    init_save, save, postprocess_save = io.save(collector, checkpoint_every=5, block_size=4)

    def step(carry, t):
        state, x = carry
        jax.debug.callback(fail, t)
        x = x * 0.5 + t
        return (save(state, True, {"x": x}, solver_state={"x": x})[0], x), None

    state = init_save({"x": 0.0}, {"x": 0.0}, scheduler.static_information(samples_collected=STEPS))
    resumed = collector.resume()
    x = jnp.asarray(resumed[0].solver_state["x"]) if resumed else jnp.float32(1.0)
    run = jax.jit(lambda state, x, steps: jax.lax.scan(step, (state, x), steps)[0])
    try:
        state, x = run(state, x, jnp.arange(int(state.step), STEPS))
    except Exception as error:
        failure = error if cycle else None
        raise RuntimeError(f"run failed at step {fail_at}") from failure
    return np.asarray(postprocess_save(state, None)["samples"]["x"])


def _uninterrupted() -> np.ndarray:
    x, draws = np.float32(1.0), []
    for t in range(STEPS):
        x = np.float32(x * np.float32(0.5) + np.float32(t))
        draws.append(x)
    return np.array(draws)


_RETRIES = f"""
import sys
sys.path[:0] = [{os.path.dirname(__file__)!r}, {os.path.dirname(forked.__file__)!r}]  # this module's imports
from test_hdf5_retry_after_a_failed_run import _run, _uninterrupted
path, cycle = sys.argv[1], sys.argv[2] == "cycle"
for fail_at in (13, 23, 33):  # three failures in a row, each retried at once, without sleeping
    try:
        _run(path, fail_at, cycle=cycle)
    except RuntimeError as error:
        assert str(error) == f"run failed at step {{fail_at}}", error
assert (_run(path, None) == _uninterrupted()).all()
"""


@pytest.mark.parametrize("cycle", ["dropped", "cycle"])
def test_a_run_retried_at_once_with_a_new_collector_continues_from_the_checkpoint(tmp_path, cycle) -> None:
    command = [sys.executable, "-c", textwrap.dedent(_RETRIES), str(tmp_path / "samples.h5"), cycle]
    ran = forked.run(command, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["samples.h5"]  # no checkpoint, no lock left


def test_a_failed_collector_that_the_caller_still_holds_is_not_taken_over(tmp_path) -> None:
    path = str(tmp_path / "samples.h5")
    held: list[io.HDF5Collector] = []
    with pytest.raises(RuntimeError, match="failed at step 23"):
        _run(path, 23, held)
    for _ in range(3):  # held, it may still be running: one writer at a time
        with pytest.raises(CheckpointError, match=r"this one\).*still open; call that collector's close\(\) first"):
            _run(path, None)
    held.pop().close()
    np.testing.assert_array_equal(_run(path, None), _uninterrupted())


def test_a_failed_collector_held_only_by_its_kept_exception_is_closed_by_the_command_the_refusal_gives(tmp_path):
    """The collector was made inside the function that failed: only that function's frames, which the exception kept
    (as IPython's ``sys.last_exc``) holds, hold it, and the caller has no name to call its ``close()`` with."""
    path = str(tmp_path / "samples.h5")
    try:
        _run(path, 23)
    except RuntimeError as error:
        kept = error
    with pytest.raises(CheckpointError, match=r"where nothing names that collector") as refused:
        _run(path, None)
    exec(str(refused.value).rsplit(", run ", 1)[1])  # what the message says to run, as it says it
    np.testing.assert_array_equal(_run(path, None), _uninterrupted())
    assert kept.__traceback__ is not None
