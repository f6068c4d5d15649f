"""A CheckpointManager's grouped settings (``keep=KeepPolicy(...)``, ``local=LocalTier(...)``) and the keywords of
before, which still work as deprecated shortcuts: each warns with the form that replaces it, and a shortcut that
conflicts with its grouped setting, or a misspelled keyword, is refused naming both."""

from __future__ import annotations

import inspect
import warnings

import jax.numpy as jnp
import pytest

import jaxstow
from jaxstow import CheckpointManager, KeepPolicy, LocalTier
from jaxstow.errors import ArgumentError


def _save(manager: CheckpointManager, steps: range) -> None:
    for step in steps:
        if manager.should_save(step):
            manager.save(step, {"w": jnp.full(2, step)}, metrics={"loss": 1 / (1 + step)})
    manager.wait()


def test_the_manager_takes_at_most_12_settings_and_a_short_docstring():
    parameters = inspect.signature(CheckpointManager.__init__).parameters
    named = [name for name, p in parameters.items() if name != "self" and p.kind is not p.VAR_KEYWORD]
    assert len(named) <= 12, named
    assert len(inspect.getdoc(CheckpointManager.__init__).splitlines()) <= 25
    assert jaxstow.KeepPolicy is KeepPolicy and jaxstow.checkpoint.LocalTier is LocalTier


def test_every_shortcut_warns_with_its_grouped_form_and_saves_the_same(tmp_path):
    grouped = tmp_path / "grouped"
    with CheckpointManager(
        grouped / "store",
        save_every=4,
        keep=KeepPolicy(keep_last=1, keep_best=1, metric="loss", mode="max"),
        local=LocalTier(grouped / "local", save_every=2, keep_last=1, replicas=0),
    ) as manager:
        _save(manager, range(1, 10))
        expected = (manager.steps(tier="persistent"), manager.steps(tier="local"), manager.best_step())
    shortcut = tmp_path / "shortcut"
    with pytest.warns(DeprecationWarning) as caught:
        manager = CheckpointManager(
            shortcut / "store",
            save_every=4,
            keep_last=1,
            keep_best=1,
            metric="loss",
            mode="max",
            local_directory=shortcut / "local",
            local_save_every=2,
            local_keep_last=1,
            local_replicas=0,
        )
    with manager:
        _save(manager, range(1, 10))
        assert (manager.steps(tier="persistent"), manager.steps(tier="local"), manager.best_step()) == expected
    assert expected == ([1, 8], [8], 1)
    messages = sorted(str(warning.message) for warning in caught)
    assert messages == [
        "CheckpointManager(keep_last=1, keep_best=1, metric='loss', mode='max') is deprecated: pass "
        "keep=KeepPolicy(keep_last=1, keep_best=1, metric='loss', mode='max') (from jaxstow import KeepPolicy)",
        f"CheckpointManager(local_directory={shortcut / 'local'!r}, local_save_every=2, local_keep_last=1, "
        f"local_replicas=0) is deprecated: pass local=LocalTier({shortcut / 'local'!r}, save_every=2, keep_last=1, "
        "replicas=0) (from jaxstow import LocalTier)",
    ]
    assert caught[0].filename == __file__  # the warning points at the caller's line


@pytest.mark.parametrize(
    ("orbax", "here"),
    [
        ("max_to_keep", "keep=KeepPolicy(keep_last=...)"),
        ("save_interval_steps", "save_every=..."),
        ("keep_period", "keep=KeepPolicy(keep_every=...)"),
        ("enable_async_checkpointing", "saves run in the background"),
        ("create", "the first save makes the folder"),
    ],
)
def test_orbaxs_option_names_are_refused_with_the_setting_that_does_it_here(tmp_path, orbax, here):
    with pytest.raises(ArgumentError) as raised:
        CheckpointManager(tmp_path / "a", **{orbax: 3})
    assert f"unexpected keyword argument {orbax!r} (orbax's CheckpointManagerOptions' {orbax}: here, " in str(
        raised.value
    )
    assert here in str(raised.value)
    assert not (tmp_path / "a").exists()


def test_a_shortcut_and_its_grouped_setting_together_are_refused(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused before any warning
        with pytest.raises(ArgumentError, match=r"keep=KeepPolicy\(.*\) and keep_last=3 both set the keep rules"):
            CheckpointManager(tmp_path / "a", keep=KeepPolicy(keep_best=1, metric="loss"), keep_last=3)
        with pytest.raises(ArgumentError, match=r"local=LocalTier\(.*\) and local_keep_last=3 both set the local tier"):
            CheckpointManager(tmp_path / "a", local=LocalTier(tmp_path / "l"), local_keep_last=3)
    with pytest.raises(ArgumentError, match=r"unexpected keyword argument 'keep_lats' \(did you mean keep_last\?\)"):
        CheckpointManager(tmp_path / "a", keep_lats=3)
    with pytest.raises(ArgumentError, match=r"unexpected keyword argument 'local_dir' \(did you mean local_directory"):
        CheckpointManager(tmp_path / "a", local_dir=tmp_path / "l")
    with pytest.raises(ArgumentError, match=r"keep must be a jaxstow.KeepPolicy, such as KeepPolicy\(keep_last=3\)"):
        CheckpointManager(tmp_path / "a", keep=3)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="keep_last must be a positive integer or None, not 0"):
        CheckpointManager(tmp_path / "a", keep_last=0)
    assert not (tmp_path / "a").exists()
