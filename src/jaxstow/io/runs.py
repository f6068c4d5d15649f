"""Resumable sampling runs: every chain stepped inside ``jit``, each kept draw streamed to an HDF5 file, the sampler's
state checkpointed with the draws, and a run killed at any moment continued by the same call.

The run's segments end at every ``checkpoint_every``-th step (and where the warm-up ends), each one call of a
jit-compiled ``lax.scan`` returning at most 16 MiB of draws, which an :class:`~jaxstow.io.HDF5Collector` writes
while the next segment runs. The program holds no host callback, so JAX's persistent compilation cache can keep it;
a run continued has draws bit for bit those of an uninterrupted run. See docs/sampling-runs.md.

>>> import os, tempfile, jax, jax.numpy as jnp
>>> from jaxstow import io
>>> def start():                                   # two chains of a random walk, the keys as raw key data
...     return {"x": jnp.zeros(2), "key": jax.random.key_data(jax.random.split(jax.random.key(0), 2))}
>>> def step(state, t):
...     keys = jax.vmap(jax.random.split)(state["key"])
...     x = state["x"] + jax.vmap(jax.random.normal)(keys[:, 1])
...     return {"x": x, "key": keys[:, 0]}, {"x": x}, jnp.ones(2, bool)
>>> path = os.path.join(tempfile.mkdtemp(), "walk.h5")
>>> draws = io.run_chains(path, start, step, num_steps=50, checkpoint_every=20)
>>> draws["x"].shape                               # (chains, draws)
(2, 50)
>>> again = io.run_chains(path, start, step, num_steps=50, checkpoint_every=20)   # finished: read, not run
>>> bool((again["x"] == draws["x"]).all())
True
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxstow._storage.failures import storage_failures
from jaxstow._util.optional import require
from jaxstow.errors import ArgumentError, CheckpointError, JaxstowError, StructureMismatchError
from jaxstow.io.batching import _shape_dtype, spec_of
from jaxstow.io.chains import SampleLayout, read_checkpoints, restore_checkpoint
from jaxstow.io.collector import ChainCheckpoint
from jaxstow.io.hdf5 import HDF5Collector, checkpoint_path, layout_problems
from jaxstow.io.hdf5_damage import damage_refused
from jaxstow.io.hdf5_layout import RUN_ATTRIBUTE, WARMUP_GROUP, run_id_of
from jaxstow.io.hdf5_resume import refuse_lost_checkpoint
from jaxstow.io.hdf5_writable import writable_file
from jaxstow.io.live import read_stacked, run_finished
from jaxstow.io.scheduler import static_information
from jaxstow.io.swmr import WriterLock, open_for_reading, read_superblock

__all__ = ["run_chains"]

#: The members of the run's record that files of earlier versions lack: compared only where the file has them.
_RECORDED_LATER = frozenset({"arguments", "algorithm_settings", "settings", "step_settings", "code"})
#: What a run started with another digest of these was started from.
_DIGESTS = {
    "arguments": "from other arrays (data or initial values) than this call gives",
    "algorithm_settings": "with an algorithm or warm-up made with other settings (step size, mass matrix, ...) than "
    "this call's",
    "step_settings": "with step_args or draw functions holding other values (an SG-MCMC step size, a minibatch, ...) "
    "than this call's",
    "code": "with functions (a log density, a model, step_args or draw) of other code or data than this call's (their "
    "code, the functions they call, and the values of their modules they read, such as data at the top of a script)",
}
#: At most this many bytes of draws (of every chain) wait on the device for the host to hand them to the collector.
_DEVICE_ROWS_BYTES = 16 << 20

Step = Callable[[Any, jax.Array], tuple[Any, Any, jax.Array]]


def run_chains(
    path: str | os.PathLike[str],
    start: Callable[[], Any],
    step: Step,
    *,
    num_steps: int,
    checkpoint_every: int,
    draws_per_chain: int | None = None,
    identity: Mapping[str, Any] | None = None,
    warmup: Callable[[Any], Mapping[str, jax.Array]] | None = None,
    warmup_steps: int = 0,
) -> dict[str, np.ndarray]:
    """Run every chain ``num_steps`` steps, streaming the kept draws into the HDF5 file ``path``; return the draws.

    A finished run is read from its file; a killed one continues from its last checkpoint. See docs/sampling-runs.md.

    Args:
        path: The HDF5 file; one process at a time writes it.
        start: Returns the state of every chain, stacked (leading axis: the chains), PRNG keys as raw key data
            (``jax.random.key_data``); called only when the run starts.
        step: ``step(state, t)`` advances every chain by step ``t`` (an int32 from 0) and returns
            ``(state, draws, keep)``: the draws of every chain (leading axis the chains) and whether each keeps them,
            ``keep`` shaped ``(chains,)``, booleans or integers (nonzero keeps; else an ArgumentError).
        num_steps: The steps of the run.
        checkpoint_every: The state is checkpointed with the draws after every ``checkpoint_every`` steps.
        draws_per_chain: If known, sizes the file and the blocks of draws.
        identity: JSON values that make this run this run (a seed, a model's name, ...), recorded in the file.
        warmup: Returns results to keep (a step size, a mass matrix) from the state after ``warmup_steps`` steps,
            written to ``/warmup/<name>``.
        warmup_steps: The step after which ``warmup`` reads the state.

    Returns:
        ``{variable: array}`` shaped ``(chains, draws, ...)``, named by the draws' dict keys joined with ``.``.

    Raises:
        CheckpointError: Another process writes the run, or the file's run has other settings or ``identity``.
        StructureMismatchError: The file holds draws or a state of another structure.
    """
    name = os.fspath(path)
    require("h5py", extra="h5py", purpose="run_chains")
    for option, value, least in (("checkpoint_every", checkpoint_every, 1), ("num_steps", num_steps, 0)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < least:
            raise ArgumentError(f"{option} must be an integer of at least {least}, not {value!r}")
    checkpoint_every, num_steps = int(checkpoint_every), int(num_steps)
    start = jax.jit(start)  # traced once: for the state's shapes here, and compiled when the run starts
    state_spec = spec_of(jax.eval_shape(start))  # without weak types, as _strong leaves the state
    chains = _chain_count(state_spec)
    run = jax.jit(functools.partial(_sample_rows, step, chains))  # not donated: a segment's state is checkpointed later
    steps = spec_of(np.arange(checkpoint_every, dtype=np.int32))
    drawn = jax.eval_shape(run, state_spec, steps)[1][0]  # traced once: for the draws' shapes, and for the run
    draw_spec = jax.tree.map(lambda leaf: _shape_dtype(leaf.shape[:1] + leaf.shape[2:], leaf.dtype), drawn)
    if not jax.tree.leaves(draw_spec):
        raise ArgumentError(f"step keeps no arrays in its draws ({drawn!r}): return what each kept step stores")
    warmup_spec = jax.eval_shape(warmup, state_spec) if warmup is not None else {}
    record = {**(identity or {}), "chains": chains, "num_steps": num_steps, "checkpoint_every": checkpoint_every}
    record = json.loads(json.dumps(record))  # as it reads back from the file
    with WriterLock(name) as lock:
        if os.path.exists(name):
            with damage_refused(name, "write the run to another file"):  # cut short by a run that filled the disk
                continued = _continued(name, record, _chain_spec(state_spec), _chain_spec(draw_spec), lock)
            if continued:
                return _all_chains(name, read_stacked(name), chains)
            lock.clear_stale_flags()  # the flags a killed writer left (only such a one: see _continued)
        # The run's lock keeps other writers out; a failing disk names the file.
        with _flags_left_to_the_next_run(name, lock), storage_failures(name, hdf5=True):
            with damage_refused(name, "write the run to another file"):  # cut short by a run that filled the disk
                opened = writable_file(name, "a")
            with opened as file:
                if RUN_ATTRIBUTE not in file.attrs:
                    file.attrs[RUN_ATTRIBUTE] = json.dumps(record)
                    for key, spec in warmup_spec.items():
                        file.create_dataset(f"{WARMUP_GROUP}/{key}", shape=spec.shape, dtype=spec.dtype)
                _sample(
                    file,
                    start,
                    run,
                    state_spec,
                    draw_spec,
                    chains,
                    num_steps,
                    checkpoint_every,
                    draws_per_chain,
                    warmup,
                    warmup_steps,
                )
    return read_stacked(name)


def _sample(
    file: Any,
    start: Callable[[], Any],
    run: Callable[[Any, jax.Array], tuple[Any, Any]],
    state_spec: Any,
    draw_spec: Any,
    chains: int,
    num_steps: int,
    checkpoint_every: int,
    draws_per_chain: int | None,
    warmup: Callable[[Any], Mapping[str, jax.Array]] | None,
    warmup_steps: int,
) -> None:
    collector = HDF5Collector(file)
    information = static_information(samples_collected=draws_per_chain)
    for _ in range(chains):
        collector.register_chain(_chain_spec(draw_spec), _chain_spec(state_spec), information)
    resumed = collector.resume()
    if resumed:
        state = jax.tree.map(lambda *leaves: jnp.stack(leaves), *(resumed[i].solver_state for i in range(chains)))
        done, counts = resumed[0].step, [resumed[i].sample_count for i in range(chains)]
    else:
        state, done, counts = start(), 0, [0] * chains
        _hand_over(collector, counts, 0, None, state)
    state = _strong(state)  # as every segment leaves it: the same compiled segments for a fresh and a continued run
    if warmup is not None and done >= warmup_steps:
        _write_warmup(file, warmup(state))
    rows = max(1, min(checkpoint_every, _DEVICE_ROWS_BYTES // max(1, _bytes(draw_spec))))  # every chain's draws
    finished = None
    for begin, end in _segments(done, num_steps, checkpoint_every, rows, warmup_steps):
        state, drawn = run(state, jnp.arange(begin, end, dtype=jnp.int32))
        if finished is not None:  # the segment before this one, while this one runs
            _hand_over(collector, counts, *finished, checkpoint_every=checkpoint_every)
        finished = (begin, drawn, state)
        if warmup is not None and end == warmup_steps:
            _write_warmup(file, warmup(state))
    if finished is not None:
        _hand_over(collector, counts, *finished, checkpoint_every=checkpoint_every)
    collector.finalize_chains(list(range(chains)))


def _hand_over(
    collector: HDF5Collector, counts: list[int], begin: int, drawn: Any, state: Any, *, checkpoint_every: int = 1
) -> None:
    """Give the collector a segment's kept draws, each chain's after those it holds; at every ``checkpoint_every``-th
    step, checkpoint every chain's state with them (``drawn`` is ``None`` for the state a run starts with)."""
    steps = 0
    if drawn is not None:
        draws, keep = jax.device_get(drawn)  # waits for the segment; leaves (chains, steps, ...)
        steps = keep.shape[1]
        leaves = jax.tree.leaves(draws)
        blocks = {}
        for chain, count in enumerate(counts):
            rows = keep[chain]
            kept = steps if rows.all() else int(rows.sum())
            if kept:
                blocks[chain] = (count, [leaf[chain] if kept == steps else leaf[chain][rows] for leaf in leaves])
                counts[chain] += kept
        if blocks:
            collector.save_chains(blocks)
    end = begin + steps
    if end % checkpoint_every == 0:
        host = jax.device_get(state)
        collector.checkpoint_chains(
            {
                chain: ChainCheckpoint(end, count, jax.tree.map(lambda leaf, chain=chain: leaf[chain], host))
                for chain, count in enumerate(counts)
            }
        )


def _sample_rows(step: Step, chains: int, state: Any, steps: jax.Array) -> tuple[Any, Any]:
    """A segment: the sampler's steps, the draws and keep flags stacked (no host callback: a compilation cache can
    keep the program for the next process)."""

    def one(state: Any, t: jax.Array) -> tuple[Any, Any]:
        state, draws, keep = _state_draws_keep(step(state, t))
        return _strong(state), (draws, _keep_flags(keep, chains))  # the types a segment starts with

    state, drawn = jax.lax.scan(one, state, steps)
    return state, jax.tree.map(lambda leaf: jnp.moveaxis(leaf, 0, 1), drawn)  # each chain's rows contiguous


def _state_draws_keep(answer: Any) -> tuple[Any, Any, Any]:
    """``step``'s answer, checked to be ``(state, draws, keep)``."""
    if isinstance(answer, tuple | list) and len(answer) == 3:
        return answer[0], answer[1], answer[2]
    got = f"a {type(answer).__name__} of {len(answer)}" if isinstance(answer, tuple | list) else "one value"
    raise ArgumentError(
        f"step must return (state, draws, keep), got {got}: return the new state, the draws of every chain and "
        "whether each keeps them, such as `return state, draws, jnp.ones(chains, bool)` to keep every draw"
    )


def _keep_flags(keep: Any, chains: int) -> jax.Array:
    """``keep`` as one boolean per chain: booleans, or integers where nonzero keeps."""
    flags = jnp.asarray(keep)
    if not (jnp.issubdtype(flags.dtype, jnp.bool_) or jnp.issubdtype(flags.dtype, jnp.integer)):
        raise ArgumentError(
            f"step must return keep as booleans (or integers, nonzero to keep), got dtype {flags.dtype}: return "
            "e.g. jnp.full(chains, t % thin == 0)"
        )
    if flags.shape != (chains,):
        raise ArgumentError(
            f"step must return keep as one flag per chain, shape ({chains},), got shape {flags.shape}: give one flag "
            f"to every chain with jnp.full(({chains},), keep)"
        )
    return flags.astype(jnp.bool_)


def _segments(done: int, num_steps: int, every: int, rows: int, warmup_steps: int) -> Iterator[tuple[int, int]]:
    """The segments ``[begin, end)`` from ``done``: they end at each multiple of ``every``, ``rows`` steps after
    one at most, and where the warm-up ends; their ends depend on where they are, not on where the run started.

    >>> list(_segments(0, 10, 4, 4, 6)), list(_segments(8, 10, 4, 4, 6)), list(_segments(0, 9, 4, 3, 0))
    ([(0, 4), (4, 6), (6, 8), (8, 10)], [(8, 10)], [(0, 3), (3, 4), (4, 7), (7, 8), (8, 9)])
    """
    begin = done
    while begin < num_steps:
        interval = begin // every * every
        end = min(num_steps, interval + every, interval + ((begin - interval) // rows + 1) * rows)
        if begin < warmup_steps < end:
            end = warmup_steps
        yield begin, end
        begin = end


def _write_warmup(file: Any, results: Mapping[str, jax.Array]) -> None:
    for key, value in results.items():
        file[f"{WARMUP_GROUP}/{key}"][...] = np.asarray(value)
    file.flush()


def _bytes(spec: Any) -> int:
    return sum(int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(spec))


def _strong(state: Any) -> Any:
    """``state`` without weak types (which would give a segment another compiled program, maybe other results)."""
    return jax.tree.map(lambda leaf: jnp.asarray(leaf, jnp.result_type(leaf)), state)


def _chain_count(spec: Any) -> int:
    leaves = jax.tree.leaves(spec)
    if not leaves or any(np.ndim(leaf) == 0 for leaf in leaves):
        raise ArgumentError("start() must return a state whose every leaf has a leading axis of chains")
    for leaf in leaves:
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            raise ArgumentError(
                "the state holds a typed PRNG key: carry it as jax.random.key_data(key), and wrap it again with "
                "jax.random.wrap_key_data inside step, so that it can be checkpointed"
            )
    counts = {leaf.shape[0] for leaf in leaves}
    if len(counts) != 1:
        raise ArgumentError(
            f"every leaf of the state needs the same leading axis of chains, got sizes {sorted(counts)}"
        )
    return int(counts.pop())


def _chain_spec(spec: Any) -> Any:
    return jax.tree.map(lambda leaf: _shape_dtype(leaf.shape[1:], leaf.dtype), spec)


def _same_settings(name: str, saved: Mapping[str, Any], record: Mapping[str, Any], keys: list[str]) -> None:
    """Refuse a run whose ``keys`` of ``record`` differ from those ``saved`` in the file at ``name``, naming the
    first and both its values (or, for what is recorded as a digest, what it stands for)."""
    for key in keys:
        if saved.get(key) != record.get(key):
            started = (
                f"{_DIGESTS[key]}: their digests differ"
                if key in _DIGESTS
                else f"with {key}={saved.get(key)!r}, but this call gives {key}={record.get(key)!r}"
            )
            raise CheckpointError(
                f"{name} holds a run started {started}; continue it with the arguments it was started with, or "
                "write this run to another file (nothing was written)",
                file=name,
                path=key,
            )


def _continued(name: str, record: Mapping[str, Any], state_spec: Any, draw_spec: Any, lock: WriterLock) -> bool:
    """Check, before writing anything, that the file at ``name`` holds this run, with the draws and checkpointed
    states of this run; whether it is finished (then its checkpoint is removed).

    Writer flags that no killed run left are refused; a killed run's are cleared only where the file cannot be read
    otherwise (its writer was killed before it entered SWMR mode).
    """
    writer = read_superblock(name).writer
    if writer is not None and (writer == "a writer not in SWMR mode" or not lock.killed):
        lock.clear_stale_flags()
    with open_for_reading(name) as file:
        text = file.attrs.get(RUN_ATTRIBUTE)
        if text is None:
            raise CheckpointError(
                f"{name} exists but holds no run of jaxstow.io (no {RUN_ATTRIBUTE} attribute): it is left as it "
                "is; write the run to another file",
                file=name,
            )
        saved = _record_of(name, text)
        keys = sorted(key for key in set(saved) | set(record) if key in saved or key not in _RECORDED_LATER)
        _same_settings(name, saved, record, [key for key in keys if key not in _DIGESTS])  # named, with both values
        stored = read_checkpoints(checkpoint_path(name), run_id_of(file, name), samples=name)
        if not stored:
            refuse_lost_checkpoint(file, checkpoint_path(name))
        for chain, checkpoint in stored.items():
            restore_checkpoint(checkpoint, state_spec, chain_id=chain, file=checkpoint_path(name))
        layout = SampleLayout.of(draw_spec)
        problems = [
            problem
            for chain in range(record["chains"])
            if f"chain~{chain}" in file
            for problem in layout_problems(file, chain, layout, stored.get(chain, {}).get("sample_count", 0))
        ]
        if problems:
            raise StructureMismatchError(
                [*problems, "the run's draws are not those the file holds: write this run to another file"], file=name
            )
        _same_settings(name, saved, record, [key for key in _DIGESTS if key in keys])  # what only a digest tells
    try:
        finished = run_finished(name)
    except JaxstowError:  # no chain registered yet: the run starts again
        return False
    if finished:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(checkpoint_path(name))
    return finished


@contextlib.contextmanager
def _flags_left_to_the_next_run(name: str, lock: WriterLock) -> Iterator[None]:
    """Where the block, which writes the file at ``name``, fails and leaves the file's writer flags set (a full disk
    failed its close), leave the lock file naming this process, as a killed run's is: the next run then clears the
    flags and continues from the last checkpoint, where it would refuse flags that no killed run left."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(JaxstowError, OSError):
            if read_superblock(name).writer is not None:
                lock.abandon()
        raise


def _record_of(name: str, text: Any) -> dict[str, Any]:
    """The run's record as the file's attribute holds it; a :class:`CheckpointError` if it holds none."""
    try:
        record = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        record = None
    if not isinstance(record, dict):
        raise CheckpointError(
            f"{name}'s {RUN_ATTRIBUTE} attribute is not the record of a run (damaged, or not written by jaxstow.io): "
            "it is left as it is; write the run to another file",
            file=name,
        )
    return record


def _all_chains(name: str, draws: dict[str, np.ndarray], chains: int) -> dict[str, np.ndarray]:
    """The draws of a finished run, read from its file, if the file holds them of every chain of the run."""
    held = sorted({int(np.shape(values)[0]) for values in draws.values()})
    if held != [chains]:
        raise CheckpointError(
            f"{name} holds the draws of {', '.join(map(str, held))} chains, but its run has {chains}: the file is "
            "damaged; write the run to another file",
            file=name,
        )
    return draws
