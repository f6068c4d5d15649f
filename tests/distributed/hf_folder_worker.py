"""One process of a ``jax.distributed`` run that loads a sharded safetensors folder onto a global mesh:
``hf_folder_worker.py PROCESS COUNT DEVICES PORT FOLDER``.

The folder holds ``w`` (float32, ``ROWS`` x 256) and ``b`` (256); ``w`` is restored with its rows split over every
device of the run, ``b`` replicated. Each process checks the rows it holds and prints one JSON line: the bytes it read
from files (``/proc/self/io``) during the load, and the bytes its devices hold.
"""

from __future__ import annotations

import json
import os
import sys

process, count, devices, port, folder = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=count, process_id=process)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxstow  # noqa: E402

ROWS = 1024


def bytes_read() -> int:
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


mesh = jax.make_mesh((len(jax.devices()),), ("x",))
like = {"w": jax.ShapeDtypeStruct((ROWS, 256), jnp.float32), "b": jax.ShapeDtypeStruct((256,), jnp.float32)}
shardings = {"w": NamedSharding(mesh, P("x")), "b": NamedSharding(mesh, P())}
jaxstow.load(folder, like, sharding=shardings)  # every code path loaded before measuring
before = bytes_read()
state = jaxstow.load(folder, like, sharding=shardings)
after = bytes_read()
want = np.arange(ROWS * 256, dtype=np.float32).reshape(ROWS, 256)
held = 0
for shard in state["w"].addressable_shards:
    np.testing.assert_array_equal(np.asarray(shard.data), want[shard.index])
    held += shard.data.nbytes
np.testing.assert_array_equal(np.asarray(state["b"].addressable_shards[0].data), want[0])
print(json.dumps({"process": process, "bytes_read": after - before, "bytes_held": held}), flush=True)
os._exit(0)  # without jax's shutdown barrier: every process has printed what it saw
