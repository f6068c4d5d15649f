"""Sampling-run benchmark: a blackjax run streamed to HDF5 and checkpointed, against the same sampler keeping its draws
on the device; and how long a reader in another process takes to get the draws so far while the run goes on.

Run from the repository root: ``python bench/bench_sampling.py`` (``--rounds N`` to change the number of rounds,
``--in-jit`` for the first table alone). It runs on the device JAX picks (an accelerator when it sees one, whose
platform the output names), the draws streamed from it to the host.

Two workloads, every step's draw kept:

- NUTS on eight schools (non-centred, 10 parameters), 4 chains, step size 0.4 and a unit mass matrix;
- SGLD on a Bayesian logistic regression with 100 parameters (1,000 points, minibatches of 32), 8 chains.

The baseline is the sampler in one jit-compiled ``lax.scan`` over all its steps (every chain under ``vmap``), the
draws stacked on the device, compiled ahead. The streamed run is ``io.blackjax.sample`` into a new HDF5 file: the draws
go to the file in blocks while the run goes on, and the chains' state is checkpointed with them (flushed and fsynced)
every ``checkpoint_every`` steps. It compiles its programs at each call: JAX's persistent compilation cache (in a
temporary folder, warmed by a first call) gives it the sampler's program, and what remains of the call's fixed cost
(tracing the sampler, compiling the program that streams, creating the file) is measured with the rest. Each method
runs at two lengths, N and 2N steps; the *marginal* ratio (streamed(2N) - streamed(N)) / (device(2N) - device(N))
is the cost of streaming and checkpointing per step, the fixed costs cancelled (in wall time, and in CPU time of the
process, every thread counted: the writer's work shows even where it overlaps the sampler's); *host CPU* is the CPU
time of the Python threads (handing the draws over, writing them, checkpointing) per step of the streamed run, as a
share of the device run's CPU time per step: the work streaming adds, which the load of other processes on this
shared machine does not change as it changes wall times. The *whole-call* ratio is at 2N, the fixed costs included.
Methods run in rounds, every run once per round in a shuffled order (fixed seed), and the table gives the medians of
the rounds; each round's ratios pair runs seconds apart, so that the load of this shared machine falls on both sides.

First, saving from inside jit: the same NUTS run, 4 chains x 10,000 steps in one jit-compiled ``lax.scan``, every
step's positions saved by ``io.save`` to an ``HDF5Collector`` that checkpoints each chain's state every 2,000 steps,
against the scan stacking the positions on the device; one strategy for every round (its runs go on in one file), at
least 9 rounds after one not counted, the two in a shuffled order in each, their draws compared bit for bit. Target:
the median paired ratio <= 1.05x; the CPU ratio counts every thread, XLA's included. The last column counts the rounds
of each program that XLA's CPU runtime ran on two threads of its pool (the process's CPU time 1.5 times the round's
wall time or more): in some runs of either program, each step's work goes back and forth between them, which changes
that round's time by up to 2.5 times, so that the rounds' ratios range widely around their median.

The reader is another process that calls ``jaxstow.io.live.read_draws`` (what ``io.to_inference_data`` and
``jaxstow watch`` read) in a loop while the NUTS run writes its file; the table gives the median and the slowest read
and the draws per chain the reads returned.
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy import stats
from timing import format_table

from jaxstow import io

Y = jnp.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SIGMA = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
#: The most the streamed run may cost per step, as a share of the sampler's own time.
TARGET = 0.05
_TICKS = os.sysconf("SC_CLK_TCK")

READER = """
import json, sys, time
from jaxstow.io.live import read_draws
path, times, done = sys.argv[1], [], []
while True:
    start = time.perf_counter()
    try:
        draws = read_draws(path)
    except Exception:  # no file yet, or its chains not yet registered
        time.sleep(0.01)
        continue
    times.append(time.perf_counter() - start)
    done.append(min(draws.done))
    if draws.finished:
        break
    time.sleep(0.05)
print(json.dumps({"times": times, "done": done}))
"""


class Workload:
    """A blackjax algorithm on some chains, its step arguments, and the baseline that keeps the draws on the device."""

    def __init__(self, name: str, algorithm: Any, positions: Any, every: int, step_args: Any = None) -> None:
        self.name, self.algorithm, self.positions, self.every, self.step_args = (
            name,
            algorithm,
            positions,
            every,
            step_args,
        )
        self.chains = len(jax.tree.leaves(positions)[0])
        self.compiled: dict[int, Any] = {}
        self.expected: dict[int, list[np.ndarray]] = {}  # the device run's draws, (chains, draws, ...) per leaf

    def streamed(self, path: str, steps: int) -> dict[str, np.ndarray]:
        return io.blackjax.sample(
            path, self.algorithm, self.positions, jax.random.key(0), num_samples=steps,
            checkpoint_every=self.every, step_args=self.step_args,
        )  # fmt: skip

    def on_device(self, steps: int) -> Any:
        """The same steps as the streamed run's, in one scan that stacks the positions."""
        if steps not in self.compiled:

            def run(positions: Any, key: jax.Array) -> Any:
                states = jax.vmap(self.algorithm.init)(positions)
                keys = jax.random.split(jax.random.split(key)[1], self.chains)

                def one(state: Any, key: jax.Array, t: jax.Array) -> Any:
                    key, args_key = jax.random.split(key)
                    args = self.step_args(args_key, t) if self.step_args is not None else ()
                    out = self.algorithm.step(key, state, *args)
                    return out if jax.tree.structure(out) == jax.tree.structure(state) else out[0]

                def step(carry: Any, t: jax.Array) -> Any:
                    states, keys = carry
                    keys, step_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
                    states = jax.vmap(one, in_axes=(0, 0, None))(states, step_keys, t)
                    return (states, keys), getattr(states, "position", states)

                return jax.lax.scan(step, (states, keys), jnp.arange(steps))[1]

            self.compiled[steps] = jax.jit(run).lower(self.positions, jax.random.key(0)).compile()
        return jax.block_until_ready(self.compiled[steps](self.positions, jax.random.key(0)))


def eight_schools() -> Workload:
    def logdensity(p: dict[str, jax.Array]) -> jax.Array:
        tau = jnp.exp(p["log_tau"])
        theta = p["mu"] + tau * p["eta"]
        prior = stats.norm.logpdf(p["mu"], 0, 5) + stats.cauchy.logpdf(tau, 0, 5) + p["log_tau"]
        return prior + stats.norm.logpdf(p["eta"]).sum() + stats.norm.logpdf(Y, theta, SIGMA).sum()

    nuts = blackjax.nuts(logdensity, step_size=0.4, inverse_mass_matrix=jnp.ones(10))
    positions = {"mu": jnp.zeros(4), "log_tau": jnp.zeros(4), "eta": jnp.zeros((4, 8))}
    return Workload("NUTS, eight schools, 4 chains", nuts, positions, every=5000)


def logistic_regression() -> Workload:
    features, points, batch = 100, 1000, 32
    x = jax.random.normal(jax.random.key(1), (points, features))
    y = (x @ jax.random.normal(jax.random.key(2), (features,)) > 0).astype(jnp.float32)

    def loglikelihood(w: jax.Array, batch_: tuple[jax.Array, jax.Array]) -> jax.Array:
        xs, ys = batch_
        logits = xs @ w
        return jnp.sum(ys * jax.nn.log_sigmoid(logits) + (1 - ys) * jax.nn.log_sigmoid(-logits))

    gradient = blackjax.sgmcmc.gradients.grad_estimator(lambda w: -0.5 * jnp.sum(w**2), loglikelihood, points)

    def step_args(key: jax.Array, t: jax.Array) -> tuple[Any, float]:
        rows = jax.random.randint(key, (batch,), 0, points)
        return (x[rows], y[rows]), 1e-4

    return Workload(
        "SGLD, logistic regression (100 parameters), 8 chains",
        blackjax.sgld(gradient),
        jnp.zeros((8, features)),
        every=20_000,
        step_args=step_args,
    )


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _host_cpu_seconds() -> float:
    """CPU seconds of this process's threads that are not XLA's (whose names start with ``tf_``): the Python
    threads, which hand the draws over and write them."""
    total = 0.0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm, open(f"/proc/self/task/{task}/stat") as stat:
                if comm.read().startswith("tf_"):
                    continue
                fields = stat.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICKS
    return total


def _round(workload: Workload, lengths: tuple[int, int], folder: str, order: random.Random) -> dict[Any, float]:
    runs = [(kind, steps) for kind in ("device", "streamed") for steps in lengths]
    order.shuffle(runs)
    runs.sort(key=lambda run: run[0] == "streamed" and run[1] not in workload.expected)  # checked against a device run
    seconds = {}
    for kind, steps in runs:
        path = os.path.join(folder, f"run-{time.monotonic_ns()}.h5")
        start, cpu, host = time.perf_counter(), _cpu_seconds(), _host_cpu_seconds()
        got = workload.on_device(steps) if kind == "device" else workload.streamed(path, steps)
        seconds[kind, steps] = time.perf_counter() - start
        seconds[kind, steps, "cpu"] = _cpu_seconds() - cpu
        seconds[kind, steps, "host"] = _host_cpu_seconds() - host
        if kind == "device":
            workload.expected[steps] = [np.moveaxis(np.asarray(leaf), 0, 1) for leaf in jax.tree.leaves(got)]
        else:
            for name, want in zip(sorted(got), workload.expected[steps], strict=True):
                np.testing.assert_array_equal(got[name], want, err_msg=name)  # the same draws, bit for bit
            os.unlink(path)
    return seconds


def bench(workload: Workload, lengths: tuple[int, int], rounds: int, folder: str) -> list[str]:
    order = random.Random(0)
    _round(workload, lengths, folder, order)  # compiles the baseline, fills the compilation cache: not counted
    measured = [_round(workload, lengths, folder, order) for _ in range(rounds)]
    short, long = lengths

    def marginal(r: dict[Any, float], *cpu: str) -> float:
        return (r["streamed", long, *cpu] - r["streamed", short, *cpu]) / (
            r["device", long, *cpu] - r["device", short, *cpu]
        )

    per_step = statistics.median(marginal(r) for r in measured) - 1
    host = [
        (r["streamed", long, "host"] - r["streamed", short, "host"])
        / (r["device", long, "cpu"] - r["device", short, "cpu"])
        for r in measured
    ]
    return [
        workload.name,
        f"{long:,}",
        f"{statistics.median(r['device', long] for r in measured):.2f} s",
        f"{statistics.median(r['streamed', long] for r in measured):.2f} s",
        f"{statistics.median(r['streamed', long] / r['device', long] for r in measured):.2f}x",
        f"{per_step:+.1%} ({'met' if per_step <= TARGET else 'missed'})",
        f"{statistics.median(marginal(r, 'cpu') for r in measured) - 1:+.1%}",
        f"{statistics.median(host):.1%}",
    ]


def reader_latency(folder: str) -> list[str]:
    """Read the draws so far from another process while a NUTS run writes them."""
    workload = eight_schools()
    path = os.path.join(folder, "read-while-running.h5")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"), *sys.path])}
    reader = subprocess.Popen([sys.executable, "-c", READER, path], stdout=subprocess.PIPE, text=True, env=env)
    workload.every = 200
    workload.streamed(path, 40_000)
    report = json.loads(reader.communicate(timeout=600)[0])
    times = report["times"]
    return [
        f"{len(times)}",
        f"{statistics.median(times) * 1e3:.1f} ms",
        f"{max(times) * 1e3:.1f} ms",
        f"{report['done'][0]:,} .. {report['done'][-1]:,}",
    ]


#: The in-jit case: chains, steps, and steps between checkpoints.
IN_JIT = {"chains": 4, "steps": 10_000, "every": 2000}


def in_jit_nuts(rounds: int, folder: str) -> list[str]:
    """blackjax NUTS on eight schools in one jit-compiled scan, every step's positions saved from inside the scan by
    ``io.save`` to an ``HDF5Collector`` that checkpoints every chain's state every 2,000 steps, against the same scan
    stacking the positions on the device. One strategy, made once and used for every round (its runs go on in one
    file, four chains each); both programs compiled before the first round, which is not counted. The clock covers
    ``init_save``, the run and ``postprocess_save`` (the file flushed, each checkpoint fsynced)."""
    workload = eight_schools()
    nuts, chains, steps = workload.algorithm, IN_JIT["chains"], IN_JIT["steps"]
    positions, key = workload.positions, jax.random.key(0)
    init_save, save, postprocess_save = io.save(
        io.HDF5Collector(os.path.join(folder, "in-jit.h5")), checkpoint_every=IN_JIT["every"]
    )
    information = io.scheduler.static_information(samples_collected=steps)
    one = jax.tree.map(lambda leaf: leaf[0], positions)
    solver = {"state": jax.tree.map(lambda leaf: leaf[0], jax.vmap(nuts.init)(positions)), "key": key}

    def run(saving: Any, positions: Any, key: jax.Array) -> Any:
        def step(carry: Any, t: jax.Array) -> Any:
            saving, states, keys = carry
            keys, step_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
            states = jax.vmap(lambda state, key: nuts.step(key, state)[0])(states, step_keys)
            if saving is None:
                return (saving, states, keys), states.position
            kept = jax.vmap(lambda s, state, k: save(s, True, state.position, solver_state={"state": state, "key": k}))
            return (kept(saving, states, keys)[0], states, keys), None

        carry = (saving, jax.vmap(nuts.init)(positions), jax.random.split(key, chains))
        carry, stacked = jax.lax.scan(step, carry, jnp.arange(steps))
        return stacked if saving is None else carry[0]

    device = jax.jit(functools.partial(run, None)).lower(positions, key).compile()
    streamed = jax.jit(run, donate_argnums=0)
    times: dict[str, list[float]] = {"device": [], "streamed": [], "device cpu": [], "streamed cpu": []}
    order = random.Random(0)
    for counted in [False] + [True] * rounds:
        kinds = ["device", "streamed"]
        order.shuffle(kinds)
        draws = {}
        for kind in kinds:
            start, cpu = time.perf_counter(), _cpu_seconds()
            if kind == "device":
                draws[kind] = np.asarray(jax.block_until_ready(device(positions, key))["mu"]).T
            else:
                states = jax.vmap(lambda _: init_save(one, solver, information))(jnp.arange(chains))
                results = postprocess_save(streamed(states, positions, key), None)
                draws[kind] = np.stack([result["samples"]["mu"][()] for result in results])
            if counted:
                times[kind].append(time.perf_counter() - start)
                times[f"{kind} cpu"].append(_cpu_seconds() - cpu)
        np.testing.assert_array_equal(draws["streamed"], draws["device"])  # the same draws, bit for bit
    paired = [s / d for s, d in zip(times["streamed"], times["device"], strict=True)]
    paired_cpu = [s / d for s, d in zip(times["streamed cpu"], times["device cpu"], strict=True)]
    median = statistics.median(paired)
    return [
        f"{chains} chains x {steps:,} steps, checkpoint_every={IN_JIT['every']:,}",
        f"{statistics.median(times['device']):.2f} s",
        f"{statistics.median(times['streamed']):.2f} s",
        f"{median:.3f}x ({'met' if median <= 1 + TARGET else 'missed'})",
        f"{min(paired):.3f}x .. {max(paired):.3f}x",
        f"{min(times['streamed']) / min(times['device']):.3f}x",
        f"{statistics.median(paired_cpu):.3f}x",
        f"{_on_two_threads(times, 'device')} / {_on_two_threads(times, 'streamed')} of {rounds}",
    ]


def _on_two_threads(times: dict[str, list[float]], kind: str) -> int:
    """The rounds of ``kind`` whose process used the CPU time of two threads (1.5 times the wall time or more): XLA's
    CPU runtime ran the loop's steps on two threads of its pool, each waking the other, as it does in some runs of
    either program."""
    return sum(cpu >= 1.5 * wall for wall, cpu in zip(times[kind], times[f"{kind} cpu"], strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--in-jit", action="store_true", help="only the NUTS run saved from inside jit")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        in_jit = in_jit_nuts(max(args.rounds, 9), folder)
        load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
        device = jax.devices()[0]
        print(f"jax {jax.__version__} on {device.platform}, {os.cpu_count()} cores (load average {load})")
        print(
            "blackjax NUTS, eight schools, saved from inside jit by io.save to an HDF5Collector vs stacked on the device"
        )
        headers = ["run", "on device", "streamed", "paired ratio (median)", "range", "best/best", "CPU ratio"]
        print(format_table([*headers, "rounds on 2 threads: device / streamed"], [in_jit]))
        print()
        if args.in_jit:
            return
        jax.config.update("jax_compilation_cache_dir", os.path.join(folder, "jax-cache"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        rows = [
            bench(eight_schools(), (20_000, 40_000), args.rounds, folder),
            bench(logistic_regression(), (40_000, 80_000), args.rounds, folder),
        ]
        headers = ["workload", "steps", "on device", "streamed", "whole call", "per step: wall", "CPU", "host CPU"]
        device = jax.devices()[0]
        load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
        print(
            f"jax {jax.__version__} on {device.platform} ({device.device_kind}), {os.cpu_count()} cores "
            f"(load average {load})"
        )
        print(f"streamed and checkpointed to HDF5 vs draws kept on the device (median of {args.rounds} rounds)")
        print(format_table(headers, rows))
        print()
        print("a reader in another process, while a NUTS run (4 chains, 40,000 steps) writes its file")
        print(format_table(["reads", "median read", "slowest read", "draws per chain read"], [reader_latency(folder)]))


if __name__ == "__main__":
    functools.partial(main)()
