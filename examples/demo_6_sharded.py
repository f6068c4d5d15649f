"""Two real ``jax.distributed`` processes, two CPU devices each, train a model sharded over their global 2x2 mesh and
save it with a CheckpointManager: each process writes only its own shards, process 0 commits. Then one process with a
single CPU restores the step without a target, and another restores it onto a mesh of four devices of another shape,
reading only the byte ranges each device holds.

Run: python examples/demo_6_sharded.py
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile

PROCESSES, DEVICES = 2, 2


def trainer(process: int, port: int, folder: str) -> None:
    """One process of the run: a few steps of a sharded linear regression, then a checkpoint."""
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=PROCESSES, process_id=process)
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxstow import CheckpointManager, KeepPolicy

    mesh = jax.make_mesh((2, 2), ("data", "model"))
    weights = jax.device_put(jnp.zeros((256, 64)), NamedSharding(mesh, P("data", "model")))
    target = jnp.arange(256 * 64, dtype=jnp.float32).reshape(256, 64) / 1000

    @jax.jit
    def step(weights: jax.Array) -> jax.Array:
        return weights - 0.5 * (weights - target)

    with CheckpointManager(folder, keep=KeepPolicy(keep_last=2)) as manager:
        for number in range(1, 6):
            weights = step(weights)
            manager.save(number, {"params": {"w": weights, "b": jnp.ones(64)}}, metrics={"step": number})
    files = sorted(os.listdir(os.path.join(folder, "5"))) if process == 0 else []
    print(json.dumps({"process": process, "files": files}), flush=True)
    jax.distributed.shutdown()


def restorer(folder: str, devices: int) -> None:
    """Restore the latest step in one process: whole arrays on one CPU, or laid out on a 4-device mesh."""
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxstow import CheckpointManager

    with CheckpointManager(folder) as manager:
        if devices == 1:
            state = manager.restore()
            layout = "whole, on one CPU"
        else:
            line = jax.make_mesh((devices,), ("x",))
            state = manager.restore(sharding={"params": {"w": NamedSharding(line, P(None, "x")), "b": None}})
            layout = f"on {state['params']['w'].sharding.spec} over {devices} devices"
        expected = np.arange(256 * 64, dtype=np.float32).reshape(256, 64) / 1000 * (1 - 0.5**5)
        error = float(np.max(np.abs(np.asarray(state["params"]["w"]) - expected)))
        print(f"restored step {manager.latest_step()} {layout}: max error {error:.2e}, steps kept {manager.steps()}")
        assert error < 1e-5


def main() -> None:
    if len(sys.argv) > 1:
        role, *rest = sys.argv[1:]
        trainer(int(rest[0]), int(rest[1]), rest[2]) if role == "trainer" else restorer(rest[0], int(rest[1]))
        return
    with tempfile.TemporaryDirectory() as root:
        folder = os.path.join(root, "run")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        environment = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}
        trainers = [
            subprocess.Popen(
                [sys.executable, __file__, "trainer", str(i), str(port), folder],
                stdout=subprocess.PIPE,
                text=True,
                env=environment,
            )
            for i in range(PROCESSES)
        ]
        reports = [json.loads(t.communicate()[0].strip().splitlines()[-1]) for t in trainers]
        if any(t.returncode for t in trainers):
            raise SystemExit("a training process failed")
        print(f"{PROCESSES} processes x {DEVICES} devices saved step 5 as {reports[0]['files']}")
        for devices in (1, 4):
            subprocess.run([sys.executable, __file__, "restorer", folder, str(devices)], check=True, env=environment)


if __name__ == "__main__":
    main()
