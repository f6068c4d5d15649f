"""Sample-saving benchmark: samples leaving a jit-compiled scan through ``jaxstow.io``, against keeping them on the device.

Run from the repository root: ``python bench/bench_io.py`` (``--rounds N`` to change the number of rounds,
``--fresh-processes`` for the runs in fresh processes alone).

A scan of 10,000 steps produces one sample ``{'w': float32[1000], 's': float32[]}`` per step and keeps every one.
The baseline is the cheapest way to keep them: the scan returns them as stacked outputs on the device. Against it:
``no_save`` (a device buffer in the saving state), ``io.save`` with a ``MemoryCollector`` and with an
``HDF5Collector`` (blocks of samples sent to the host during the run), the original design's one ``io_callback``
per sample, and the scan keeping nothing at all (the ceiling). Then the same with 8 chains under ``vmap``
(1,250 steps each, so again 10,000 samples).

Compilation is excluded: each method is compiled ahead of time, then the clock covers the compiled run and, for the
saving strategies, ``init_save`` before it (which allocates their storage, as the stacked scan allocates its outputs)
and ``postprocess_save`` after it (which sends the last samples and waits until the collector holds them all; the
HDF5 file is flushed, not fsynced). Two warm-up rounds are not counted, and just before each run 256 MiB of memory
are touched and freed (see ``timing.warm_memory``), so that every run finds the memory it allocates backed by the
host, whatever the run before it did. Every run's last sample is checked against the others'. Methods run in rounds,
every method once per round in a shuffled order, so that a change in the load of this shared machine falls on all
alike and no method always follows the same other one. The table gives samples per second from the best and the
median wall time of the rounds, and from the median CPU time of the process (all its threads: the HDF5 writer's work
counts even where it overlaps the scan), each also as a ratio to the stacked baseline; and the paired ratio: in each
round, the baseline's wall time over the method's, the median of the rounds.
The targets (``MemoryCollector`` >= 0.9x, ``HDF5Collector`` >= 0.85x the baseline, for 1 and for 8 chains) are judged
on the paired ratio: a method and the baseline run seconds apart in each round, so that the load of this shared
machine, which can slow every run of a phase by a third, falls on both sides of each ratio.

Then runs as a user makes them, in 10 fresh processes: in each, one strategy per collector, made once and used for
every run (as a sampler that runs in batches, or a notebook that samples again, uses it), each run's samples dropped
before the next and no memory warmed in between; 8 rounds after one not counted (which compiles and first touches
the memory), five passes per round, each running every method once in a shuffled order, the round counting the
median over its passes of the ratio of each collector's run to the stacked scan's of the same pass (a slow mode
shows in most passes; a moment's load, a drift of the machine's speed, or a run whose fresh memory the VM happened
to have at hand, in one). The table gives each
process's worst round and its median (the paired ratio of the stacked scan's wall time to the collector's, and of CPU
time), the minor page faults of each method's run (the memory it touched for the first time), and how much slower than
its fastest a fixed Python loop timed before every run got (the machine's own speed, which moves on this virtual
machine by more than the targets allow), and the fastest and slowest plain write of a run's bytes to a file, timed at
the start of every round (the filesystem's own speed: on a virtual machine whose page cache is full, buffered writes
can be several times slower than with memory free). The page cache is dropped before each process where that is
allowed (root), so that every process starts as the first does; the header says when it could not be. Targets, on the worst round of all the processes: ``MemoryCollector`` >=
0.9x, ``HDF5Collector`` >= 0.8x.

Then a realistic sampler: 8 chains of stochastic-gradient Langevin dynamics on a Bayesian logistic regression with 100
parameters (10,000 observations, minibatches of 500), 2,000 steps, every step's sample kept, saved with each collector,
against the same sampler keeping no sample at all. The target: saving costs under 5% (the paired overhead).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import h5py
import jax
import jax.numpy as jnp
import numpy as np
from cold import cannot_drop, drop_caches
from jax.experimental import io_callback
from timing import warm_memory

from jaxstow import io, scheduler

SAMPLES = 10_000
CHAINS = 8
DIM = 1000
#: The least samples/s of each collector, as a ratio to the stacked baseline (the paired ratio of the rounds).
TARGETS = {"io.save + MemoryCollector": 0.9, "io.save + HDF5Collector": 0.85}
WARMUP = 2
#: Memory touched and freed before each run: several times what any method allocates (40 MB of samples).
WARM_BYTES = 256 << 20

Times = dict[str, list[tuple[float, float]]]  # per method, round by round: (wall, cpu) seconds
Rates = dict[str, tuple[float, float, float, float]]
Go = Callable[[], np.ndarray]  # one timed run; returns the last sample of every chain, to be checked
Prepare = Callable[[], tuple[Go, Callable[[], None]]]  # sets a run up, untimed: its timed part and its cleanup


def model(w: jax.Array, t: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The work of one step, and the sample it produces."""
    w = 0.999 * w + 0.001 * jnp.cos(w + t)
    return w, {"w": w, "s": jnp.sum(w)}


INIT_SAMPLE = {"w": jnp.zeros(DIM), "s": jnp.float32(0.0)}


def _scan(body: Callable[..., Any], carry: Any, steps: int) -> Any:
    return jax.lax.scan(body, carry, jnp.arange(steps, dtype=jnp.float32))


def _chained(fun: Callable[..., Any], chains: int) -> Callable[..., Any]:
    return jax.vmap(fun) if chains > 1 else fun


def _w0(chains: int) -> jax.Array:
    return jnp.zeros((chains, DIM)) if chains > 1 else jnp.zeros(DIM)


def _nothing(w: jax.Array, steps: int) -> jax.Array:
    """Keeps no sample: only the final state, which is the last sample."""
    return _scan(lambda w, t: (model(w, t)[0], None), w, steps)[0][..., None, :]


def _stacked(w: jax.Array, steps: int) -> jax.Array:
    """Keeps every sample as a stacked output of the scan."""
    return _scan(model, w, steps)[1]


def on_device(run: Callable[[jax.Array, int], Any], chains: int, steps: int) -> Prepare:
    """A scan that keeps its samples on the device (or none); compiled once."""
    compiled = jax.jit(_chained(functools.partial(run, steps=steps), chains)).lower(_w0(chains)).compile()

    def go() -> np.ndarray:
        kept = jax.block_until_ready(compiled(_w0(chains)))
        last = kept["w"][..., -1, :] if isinstance(kept, dict) else kept[..., -1, :]
        return np.asarray(last).reshape(chains, DIM)

    return lambda: (go, lambda: None)


def strategy(make: Callable[[], tuple[io.Saving, Callable[[], None]]], chains: int, steps: int) -> Prepare:
    """A saving strategy: ``make`` returns a fresh ``(init_save, save, postprocess_save)`` and its cleanup.

    Every run gets a new strategy (and collector), compiled before the clock starts against the shapes of a saving
    state made by a throwaway twin; the clock then covers ``init_save``, the run and ``postprocess_save``. The saving
    state is donated to the run, as the strategies' documentation advises.
    """
    information = scheduler.static_information(samples_collected=steps)

    def states(init_save: Callable[..., Any]) -> Any:
        made = [init_save(INIT_SAMPLE, None, information) for _ in range(chains)]
        return jax.tree.map(lambda *leaves: jnp.stack(leaves), *made) if chains > 1 else made[0]

    (twin_init, _, _), twin_cleanup = make()
    shapes = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), states(twin_init))
    twin_cleanup()

    def prepare() -> tuple[Go, Callable[[], None]]:
        (init_save, save, postprocess_save), cleanup = make()

        def run(state, w):
            def body(carry, t):
                state, w = carry
                w, sample = model(w, t)
                state, _ = save(state, True, sample)
                return (state, w), None

            return _scan(body, (state, w), steps)[0][0]

        compiled = jax.jit(_chained(run, chains), donate_argnums=0).lower(shapes, _w0(chains)).compile()

        def go() -> np.ndarray:
            result = postprocess_save(compiled(states(init_save), _w0(chains)), None)
            return np.stack([chain["samples"]["w"][-1] for chain in (result if chains > 1 else [result])])

        return go, cleanup

    return prepare


def _no_save() -> tuple[io.Saving, Callable[[], None]]:
    return io.no_save(), lambda: None


def _memory() -> tuple[io.Saving, Callable[[], None]]:
    return io.save(io.MemoryCollector()), lambda: None


def _hdf5(folder: str) -> tuple[io.Saving, Callable[[], None]]:
    path = os.path.join(folder, "samples.h5")
    file = h5py.File(path, "w")

    def cleanup() -> None:
        file.close()
        os.unlink(path)

    return io.save(io.HDF5Collector(file)), cleanup


def per_sample_callback(steps: int) -> Prepare:
    """The original design: one host callback per kept sample (here into preallocated numpy arrays)."""
    stored = {"w": np.empty((steps, DIM), np.float32), "s": np.empty(steps, np.float32)}

    def receive(index, sample):
        stored["w"][int(index)] = sample["w"]
        stored["s"][int(index)] = sample["s"]
        return np.int32(0)

    def run(w):
        def body(carry, t):
            w, count = carry
            w, sample = model(w, t)
            jax.lax.cond(
                True, lambda: io_callback(receive, jax.ShapeDtypeStruct((), jnp.int32), count, sample), lambda: count
            )
            return (w, count + 1), None

        return _scan(body, (w, jnp.int32(0)), steps)[0]

    compiled = jax.jit(run).lower(_w0(1)).compile()

    def go() -> np.ndarray:
        jax.block_until_ready(compiled(_w0(1)))
        return stored["w"][-1:].copy()

    return lambda: (go, lambda: None)


def measure(methods: dict[str, Prepare], rounds: int) -> Times:
    """``(wall, cpu)`` seconds of each method's timed part, round by round (after two warm-up rounds); each round
    runs the methods in an order of its own, shuffled with a fixed seed."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in methods}
    reference = None
    shuffler = random.Random(0)
    for _ in range(rounds + WARMUP):
        for name in shuffler.sample(list(methods), len(methods)):
            go, cleanup = methods[name]()
            warm_memory(WARM_BYTES)
            wall, cpu = time.perf_counter(), time.process_time()
            last = go()
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
            cleanup()
            reference = last if reference is None else reference
            np.testing.assert_array_equal(last, reference, err_msg=f"{name} did not keep the samples of the others")
    return {name: values[WARMUP:] for name, values in times.items()}


def rates_of(times: Times, samples: int, baseline: str) -> Rates:
    """Per method: samples/s from the best and the median wall time and from the median CPU time, and the paired
    ratio to ``baseline`` (the median over the rounds of the baseline's wall time over the method's)."""
    base = [wall for wall, _ in times[baseline]]
    return {
        name: (
            samples / min(wall for wall, _ in values),
            samples / statistics.median(wall for wall, _ in values),
            samples / statistics.median(cpu for _, cpu in values),
            statistics.median(base_wall / wall for base_wall, (wall, _) in zip(base, values, strict=True)),
        )
        for name, values in times.items()
    }


def verdicts(title: str, rates: Rates) -> list[str]:
    """One line per target: the collector's paired ratio to the baseline, and whether it passes."""
    lines = []
    for name, target in TARGETS.items():
        ratio = rates[name][3]
        lines.append(f"  {title}: {name} {ratio:.2f}x >= {target}x: {'pass' if ratio >= target else 'FAIL'}")
    return lines


def table(title: str, rates: Rates, baseline: str) -> list[str]:
    base = rates[baseline][:3]
    header = ("best wall", "median wall", "median CPU")
    lines = [
        title,
        f"  {'samples/s':<44}"
        + "".join(f"{h:>13}" for h in header)
        + "".join(f"{h + ' ratio':>19}" for h in header)
        + f"{'paired ratio':>14}",
    ]
    for name, (*rate, paired) in rates.items():
        lines.append(
            f"  {name:<44}"
            + "".join(f"{value:>13,.0f}" for value in rate)
            + "".join(f"{value / reference:>18.2f}x" for value, reference in zip(rate, base, strict=True))
            + f"{paired:>13.2f}x"
        )
    return lines


#: Runs as a user makes them: fresh processes, and rounds in each (after one not counted, which compiles).
FRESH = {"processes": 10, "rounds": 8}
FRESH_TARGETS = {"io.save + MemoryCollector": 0.9, "io.save + HDF5Collector": 0.8}


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


#: The passes of a round: each runs every method once, in a shuffled order, and pairs each collector's run with the
#: stacked scan's of the same pass (seconds apart, so that the machine's speed, which drifts over seconds on this
#: virtual machine, falls on both); the round counts the median of its passes' ratios: a run's slow mode shows in
#: most, a moment's load, or memory the VM happened to have at hand for the stacked scan's fresh output, in one.
RUNS_PER_ROUND = 5

#: The stacked scan run a second time in every round of the fresh processes, and paired with the first like a
#: collector: the spread of the ratio of two identical runs, which no method's worst round can be judged finer than.
CONTROL = "stacked, again"


def _fixed_loop() -> float:
    """Seconds a fixed pure-Python loop takes (no memory allocated, no jax): the machine's own speed at the moment.

    >>> _fixed_loop() > 0
    True
    """
    start = time.perf_counter()
    total = 0
    for number in range(100_000):
        total += number * number
    return time.perf_counter() - start


#: Bytes of the samples of one run (``SAMPLES`` of ``DIM`` float32 and a scalar), as a file writer writes them.
RUN_BYTES = SAMPLES * (DIM + 1) * 4


def _file_write(folder: str) -> float:
    """Seconds a plain buffered write of one run's bytes (1 MiB ``os.write`` calls to a new file) takes: the speed of
    the filesystem at the moment, which a collector writing a file cannot beat (a full page cache slows it on some
    machines several times over).

    >>> _file_write(tempfile.gettempdir()) > 0
    True
    """
    piece = bytes(1 << 20)
    path = os.path.join(folder, "plain-write.bin")
    start = time.perf_counter()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for _ in range(RUN_BYTES >> 20):
            os.write(descriptor, piece)
    finally:
        os.close(descriptor)
    seconds = time.perf_counter() - start
    os.unlink(path)
    return seconds


def process_rounds(rounds: int, folder: str) -> dict[str, dict[str, list[float]]]:
    """Runs as a user makes them, in this process: one strategy per collector, made once and used for every run (as a
    sampler that runs in batches, or a notebook that samples again, uses it), each run's samples dropped before the
    next, nothing warmed in between; ``RUNS_PER_ROUND`` passes per round, each running every method once in a shuffled
    order, after one round not counted; the round counts the median of its passes' paired ratios.

    Per collector and round: the paired ratio (the stacked scan's wall time over the collector's, the clock covering
    ``init_save``, the run and ``postprocess_save``), the same of CPU time, and per method the minor page faults of
    the timed run (memory it touched for the first time). The same ratios of the stacked scan over itself run again
    in the round (``CONTROL``) show what two identical runs differ by, a fixed Python loop timed before every run
    (``_fixed_loop``) what the machine's own speed does meanwhile, and a plain write of a run's bytes to a file at the
    start of every round (``_file_write``) what the filesystem's does.
    """
    baseline = "stacked"
    stacked = jax.jit(functools.partial(_stacked, steps=SAMPLES))
    information = scheduler.static_information(samples_collected=SAMPLES)
    strategies = {name: make()[0] for name, make in _collectors(folder).items()}

    def run_of(save: Callable[..., Any]) -> Callable[..., Any]:
        def run(state: Any, w: jax.Array) -> Any:
            def body(carry: Any, t: jax.Array) -> Any:
                state, w = carry
                w, sample = model(w, t)
                return (save(state, True, sample)[0], w), None

            return _scan(body, (state, w), SAMPLES)[0][0]

        return jax.jit(run, donate_argnums=0)

    runs = {name: run_of(save) for name, (_, save, _) in strategies.items()}

    def go(name: str) -> np.ndarray:
        if name in (baseline, CONTROL):
            return np.asarray(jax.block_until_ready(stacked(_w0(1)))["w"][-1])
        init_save, _, postprocess_save = strategies[name]
        result = postprocess_save(runs[name](init_save(INIT_SAMPLE, None, information), _w0(1)), None)
        return np.array(result["samples"]["w"][-1])  # a copy: the run's samples are dropped here

    paired = [CONTROL, *strategies]
    names = [baseline, *paired]
    report: dict[str, dict[str, list[float]]] = {
        "wall": {},
        "cpu": {},
        "faults": {name: [] for name in names},
        "machine": {"fixed loop": [], "file write": []},
    }
    for name in paired:
        report["wall"][name], report["cpu"][name] = [], []
    shuffler = random.Random(1)
    for counted in [False] + [True] * rounds:
        runs_of: dict[str, list[tuple[float, float, int]]] = {name: [] for name in names}
        last = {}
        file_write = _file_write(folder)
        if counted:
            report["machine"]["file write"].append(file_write)
        for _ in range(RUNS_PER_ROUND):
            for name in shuffler.sample(names, len(names)):
                fixed_loop = _fixed_loop()
                if counted:
                    report["machine"]["fixed loop"].append(fixed_loop)
                faults, wall, cpu = _minor_faults(), time.perf_counter(), time.process_time()
                last[name] = go(name)
                runs_of[name].append((time.perf_counter() - wall, time.process_time() - cpu, _minor_faults() - faults))
            for name in paired:
                np.testing.assert_array_equal(last[name], last[baseline], err_msg=name)
        if counted:
            for name in names:
                report["faults"][name].append(float(np.median([run[2] for run in runs_of[name]])))
            for name in paired:
                for kind, clock in enumerate(("wall", "cpu")):
                    sweeps = zip(runs_of[baseline], runs_of[name], strict=True)  # the runs of one pass of the methods
                    report[clock][name].append(float(np.median([base[kind] / run[kind] for base, run in sweeps])))
    return report


def _collectors(folder: str) -> dict[str, Callable[[], tuple[io.Saving, Callable[[], None]]]]:
    return {"io.save + MemoryCollector": _memory, "io.save + HDF5Collector": functools.partial(_hdf5, folder)}


def fresh_process_report() -> tuple[list[str], list[str]]:
    """The table of the runs in fresh processes, each process's worst round shown, and the verdicts on the targets
    (judged on the worst round of all the processes)."""
    command = [sys.executable, __file__, "--process-rounds", str(FRESH["rounds"])]
    reports = []
    undroppable = cannot_drop()
    for _ in range(FRESH["processes"]):
        if undroppable is None:
            drop_caches()  # each process finds the page cache as empty as the first: the files of runs before gone
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        reports.append(json.loads(output.splitlines()[-1]))
    names = [CONTROL, *FRESH_TARGETS]
    short = {name: name.removeprefix("io.save + ") for name in names}
    lines = [
        f"runs as a user makes them: {FRESH['processes']} fresh processes, {FRESH['rounds']} rounds each after one not "
        f"counted, one strategy per collector used for every run, 1 chain, {SAMPLES:,} samples of {DIM} float32 "
        f"and a scalar, {RUNS_PER_ROUND} passes a round, each running every method once in a shuffled order; the "
        "paired ratio (stacked scan's time over the collector's, or over its own second run, in the same pass; the "
        "median of the round's passes) of each process's worst round and its median, in wall time (CPU time); minor page faults per run, "
        "median of the rounds; a plain write of a run's bytes to a file at the start of every round, its fastest and "
        "slowest; "
        + (
            "the page cache dropped before each process"
            if undroppable is None
            else f"the page cache left as it is ({undroppable})"
        ),
        f"  {'process':<9}"
        + "".join(f"{short[name] + ' worst':>26}{'median':>16}" for name in names)
        + f"{'faults: stacked':>18}{'memory':>8}{'HDF5':>8}{'fixed loop: slowest/fastest':>29}"
        + f"{'file write, ms':>16}",
    ]
    for number, report in enumerate(reports, 1):
        row = f"  {number:<9}"
        for name in names:
            wall, cpu = report["wall"][name], report["cpu"][name]
            row += (
                f"{min(wall):>17.2f}x ({min(cpu):.2f}x){statistics.median(wall):>7.2f}x ({statistics.median(cpu):.2f}x)"
            )
        faults = [statistics.median(report["faults"][name]) for name in ("stacked", *FRESH_TARGETS)]
        fixed_loop = report["machine"]["fixed loop"]
        row += "".join(f"{count:>{width},.0f}" for count, width in zip(faults, (18, 8, 8), strict=True))
        writes = report["machine"]["file write"]
        row += f"{max(fixed_loop) / min(fixed_loop):>28.2f}x"
        lines.append(row + f"{min(writes) * 1e3:>9.0f}-{max(writes) * 1e3:.0f}")
    verdicts = []
    for name, target in FRESH_TARGETS.items():
        worst, rounds = _worst_process(reports, name)
        verdicts.append(
            f"  fresh processes: {name} worst round of all {FRESH['processes']} processes {worst:.2f}x >= {target}x: "
            f"{'pass' if worst >= target else 'FAIL'} (that process's rounds: {rounds})"
        )
    worst, rounds = _worst_process(reports, CONTROL)
    verdicts.append(
        f"  fresh processes: the stacked scan against itself, worst round {worst:.2f}x (that process's rounds: "
        f"{rounds}): what two identical runs of a round differ by on this machine"
    )
    spread = max(max(loop) / min(loop) for loop in (report["machine"]["fixed loop"] for report in reports))
    verdicts.append(
        f"  fresh processes: a fixed Python loop (no memory, no jax) timed before every run took up to {spread:.2f}x "
        "its fastest time in one process: the machine's own speed changes between runs by that much"
    )
    return lines, verdicts


def _worst_process(reports: list[dict[str, Any]], name: str) -> tuple[float, str]:
    """The worst round of ``name`` in all the processes, and every round of the process that had it."""
    rounds = min((report["wall"][name] for report in reports), key=min)
    return min(rounds), " ".join(f"{ratio:.2f}" for ratio in rounds)


#: The realistic sampler: parameters, observations, minibatch, chains, steps.
SGLD = {"dim": 100, "data": 10_000, "batch": 500, "chains": 8, "steps": 2_000}
SGLD_TARGET = 0.05


def _sgld_problem() -> tuple[jax.Array, jax.Array]:
    keys = jax.random.split(jax.random.key(1), 3)
    x = jax.random.normal(keys[0], (SGLD["data"], SGLD["dim"]))
    truth = jax.random.normal(keys[1], (SGLD["dim"],))
    y = (jax.random.uniform(keys[2], (SGLD["data"],)) < jax.nn.sigmoid(x @ truth)).astype(jnp.float32)
    return x, y


def _sgld_step(x: jax.Array, y: jax.Array, w: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One SGLD step of one chain: a minibatch gradient of the log posterior, half a step along it, and noise."""
    key, pick, noise = jax.random.split(key, 3)
    batch = jax.random.randint(pick, (SGLD["batch"],), 0, SGLD["data"])

    def log_posterior(w: jax.Array) -> jax.Array:
        logits = x[batch] @ w
        likelihood = jnp.sum(y[batch] * logits - jnp.logaddexp(0.0, logits)) * (SGLD["data"] / SGLD["batch"])
        return likelihood - 0.5 * jnp.sum(w * w)

    epsilon = 1e-4
    w = w + 0.5 * epsilon * jax.grad(log_posterior)(w) + jnp.sqrt(epsilon) * jax.random.normal(noise, w.shape)
    return w, key


def sgld(saving: Callable[[], tuple[io.Saving, Callable[[], None]]] | None) -> Prepare:
    """The sampler, keeping nothing (``saving=None``) or saving every step's sample with a fresh strategy."""
    x, y = _sgld_problem()
    chains, steps = SGLD["chains"], SGLD["steps"]
    w0 = jnp.zeros((chains, SGLD["dim"]))
    keys0 = jax.random.split(jax.random.key(2), chains)
    information = scheduler.static_information(samples_collected=steps)
    sample = {"w": jnp.zeros(SGLD["dim"])}

    def chain(state: Any, w: jax.Array, key: jax.Array, save: Any) -> Any:
        def body(carry: Any, _: Any) -> Any:
            state, w, key = carry
            w, key = _sgld_step(x, y, w, key)
            if save is not None:
                state, _ = save(state, True, {"w": w})
            return (state, w, key), None

        return jax.lax.scan(body, (state, w, key), None, length=steps)[0]

    if saving is None:
        compiled = jax.jit(jax.vmap(lambda w, k: chain(None, w, k, None)[1])).lower(w0, keys0).compile()

        def go() -> np.ndarray:
            return np.asarray(jax.block_until_ready(compiled(w0, keys0)))

        return lambda: (go, lambda: None)

    def states(init_save: Callable[..., Any]) -> Any:
        made = [init_save(sample, None, information) for _ in range(chains)]
        return jax.tree.map(lambda *leaves: jnp.stack(leaves), *made)

    (twin_init, _, _), twin_cleanup = saving()
    shapes = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), states(twin_init))
    twin_cleanup()

    def prepare() -> tuple[Go, Callable[[], None]]:
        (init_save, save, postprocess_save), cleanup = saving()
        run = jax.vmap(lambda state, w, key: chain(state, w, key, save))
        compiled = jax.jit(lambda s, w, k: run(s, w, k)[:2], donate_argnums=0).lower(shapes, w0, keys0).compile()

        def go() -> np.ndarray:
            state, w = compiled(states(init_save), w0, keys0)
            result = postprocess_save(state, None)
            kept = np.stack([chain["samples"]["w"][-1] for chain in result])
            np.testing.assert_array_equal(kept, np.asarray(w))
            return np.asarray(w)

        return go, cleanup

    return prepare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--fresh-processes", action="store_true", help="only the runs in fresh processes")
    parser.add_argument("--process-rounds", type=int, help=argparse.SUPPRESS)  # one fresh process's rounds
    args = parser.parse_args()
    if args.process_rounds is not None:
        with tempfile.TemporaryDirectory(prefix="jaxstow-bench-io-") as folder:
            print(json.dumps(process_rounds(args.process_rounds, folder)))
        return
    if args.fresh_processes:
        load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
        lines, fresh_verdicts = fresh_process_report()
        load_after = ", ".join(f"{value:.1f}" for value in os.getloadavg())
        print(f"jax {jax.__version__}, {os.cpu_count()} cores (load average {load} before, {load_after} after)")
        print(*lines, "targets:", *fresh_verdicts, sep="\n")
        return

    folder = tempfile.mkdtemp(prefix="jaxstow-bench-io-")
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"measuring (load average before: {load})...")
    baseline = "scan, stacked outputs (baseline)"
    report: list[str] = []
    passes: list[str] = []
    for chains in (1, CHAINS):
        steps = SAMPLES // chains
        methods: dict[str, Prepare] = {
            "scan, keeps nothing": on_device(_nothing, chains, steps),
            baseline: on_device(_stacked, chains, steps),
            "io.no_save": strategy(_no_save, chains, steps),
            "io.save + MemoryCollector": strategy(_memory, chains, steps),
            "io.save + HDF5Collector": strategy(functools.partial(_hdf5, folder), chains, steps),
        }
        if chains == 1:
            methods["one io_callback per sample (original design)"] = per_sample_callback(steps)
        rates = rates_of(measure(methods, args.rounds), SAMPLES, baseline)
        title = f"{chains} chain{'s under vmap' if chains > 1 else ''}, {steps:,} steps each: {SAMPLES:,} samples"
        report += [*table(title, rates, baseline), ""]
        passes += verdicts(f"{chains} chain{'s' if chains > 1 else ''}", rates)
    nothing = "SGLD, keeps no sample"
    samplers: dict[str, Prepare] = {
        nothing: sgld(None),
        "SGLD + io.save + MemoryCollector": sgld(_memory),
        "SGLD + io.save + HDF5Collector": sgld(functools.partial(_hdf5, folder)),
    }
    kept = SGLD["chains"] * SGLD["steps"]
    rates = rates_of(measure(samplers, args.rounds), kept, nothing)
    title = (
        f"realistic sampler: {SGLD['chains']} chains of SGLD, {SGLD['dim']}-parameter logistic regression, "
        f"{SGLD['steps']:,} steps, every sample kept ({kept:,})"
    )
    report += [*table(title, rates, nothing), ""]
    lines, fresh_verdicts = fresh_process_report()
    report += [*lines, ""]
    passes += fresh_verdicts
    for name in list(samplers)[1:]:
        overhead = 1 / rates[name][3] - 1
        verdict = "pass" if overhead < SGLD_TARGET else "FAIL"
        passes.append(f"  sampler: {name} costs {overhead:+.1%} over keeping nothing (< {SGLD_TARGET:.0%}): {verdict}")
    os.rmdir(folder)

    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"jax {jax.__version__}, {os.cpu_count()} cores (load average {load}), {args.rounds} rounds")
    print(*report, sep="\n")
    print("targets (the paired ratio of samples/s to the stacked baseline, round by round, median):")
    print(*passes, sep="\n")


if __name__ == "__main__":
    main()
