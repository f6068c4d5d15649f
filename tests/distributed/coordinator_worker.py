"""One process of a ``jax.distributed`` run talking through jaxstow's coordinator: ``coordinator_worker.py ACTION
PROCESS COUNT PORT``.

``talk`` runs a conversation of every kind of message and prints what it heard, then whether the keys of the finished
conversations are gone (the second's once a conversation of another scope closed); ``stall K`` has process K wait,
alive but silent, until the others raised, then reach the barrier they gave up on; ``alone`` has process 0 gather
alone (it times out) before every process gathers; ``refuse`` has process 0's decision raise, then runs another
conversation and prints whether the failed one's keys are gone. Each process prints one JSON line: what it heard, or
``error`` and ``seconds``.
"""

from __future__ import annotations

import json
import sys
import time

action, index, count, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
stalled = int(sys.argv[5]) if len(sys.argv) > 5 else -1

import jax  # noqa: E402

jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=count, process_id=index)

from jaxstow._coordination import Coordinator  # noqa: E402
from jaxstow._util import jax_compat  # noqa: E402
from jaxstow.errors import CheckpointError, StepNotFoundError  # noqa: E402

coordinator = Coordinator("runs/test", timeout=3)
report: dict[str, object] = {"process": index}
started = time.monotonic()
try:
    if action == "talk":
        with coordinator.conversation("save") as talk:
            report["gathered"] = talk.gather("summary", {"process": index}, waiting_for="its summary")
            report["decided"] = talk.decide("step", lambda: 7, waiting_for="the step")
            report["max"] = talk.agree_max("newest", 10 * index)
            talk.barrier("written", waiting_for="its files")
            first = talk.name
        with coordinator.conversation("save") as talk:  # the second conversation of a kind has another name
            report["second"] = talk.gather("summary", index, waiting_for="its summary")
            talk.barrier("done", waiting_for="the end")
            second = talk.name
        with Coordinator("runs/other", timeout=3).conversation("save") as talk:  # another scope
            talk.barrier("done", waiting_for="the end")
        client = jax_compat.distributed_client()
        report["left"] = [key for key, _ in client.key_value_dir_get(first + "/")]
        report["left of the second"] = [key for key, _ in client.key_value_dir_get(second + "/")]
    elif action == "stall":
        with coordinator.conversation("restore") as talk:
            if index == stalled:  # silent until every other process raised, as it timed out waiting for this one
                for other in set(range(count)) - {stalled}:
                    jax_compat.distributed_client().blocking_key_value_get(f"raised/{other}", 60_000)
            talk.barrier("read", waiting_for="its part of the restore")
    elif action == "alone":  # process 0 makes a call the others do not; then every process makes the same call
        if index == 0:
            try:
                with coordinator.conversation("restore") as talk:
                    talk.gather("asked", "alone", waiting_for="its request")
            except CheckpointError as error:
                report["alone"] = str(error)
            jax_compat.distributed_client().key_value_set("alone", "done")
        else:  # the others, past process 0's lone call
            jax_compat.distributed_client().blocking_key_value_get("alone", 60_000)
        with coordinator.conversation("restore") as talk:
            report["gathered"] = talk.gather("asked", index, waiting_for="its request")
    elif action in ("refuse", "refuse missing"):

        def choose() -> int:
            if action == "refuse missing":
                raise StepNotFoundError("runs/test holds no committed step to restore")
            raise ValueError("no step to restore")

        refused = coordinator.conversation("restore")
        with refused as talk:
            talk.decide("step", choose, waiting_for="the step to restore")
except (CheckpointError, ValueError) as error:
    report["error"] = f"{type(error).__name__}: {error}"
report["seconds"] = round(time.monotonic() - started, 2)
if action == "stall" and index != stalled:
    jax_compat.distributed_client().key_value_set(f"raised/{index}", "1")
if action.startswith("refuse") and count > 1:  # a conversation that failed is closed all the same: its keys go
    with coordinator.conversation("after") as talk:
        talk.barrier("done", waiting_for="the end")
    report["left"] = [key for key, _ in jax_compat.distributed_client().key_value_dir_get(refused.name + "/")]
print(json.dumps(report), flush=True)
