"""One process of a ``jax.distributed`` run that checkpoints grain ``DataLoader`` iterators: ``grain_worker.py ACTION
PROCESS COUNT PORT FOLDER``.

Each process reads its own shard of a dataset (``ShardByJaxProcess``) through two loaders: ``train`` (shuffled, a
random augmentation, batches of 4, 2 epochs) and ``eval`` (in order, batches of 3, 1 epoch). ``save`` takes 7 batches
of each, saves a step with a sharded array, the ``train`` iterator in the tree and ``jaxstow.per_process(eval
iterator)``, and reports the next batches of each (12 and 8, taken after the save: ``train``'s run into its second
epoch). ``restore`` makes fresh loaders, restores the step with them in ``like=`` and reports their next batches, and
whether the restore gave back the live iterators. Each prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os

parser = argparse.ArgumentParser()
parser.add_argument("action", choices=["save", "restore"])
parser.add_argument("process", type=int)
parser.add_argument("count", type=int)
parser.add_argument("port", type=int)
parser.add_argument("folder")
args = parser.parse_args()
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{args.port}", num_processes=args.count, process_id=args.process)

import grain  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxstow  # noqa: E402

RECORDS = 101  # an odd count: the shards drop one record
SKIP, NEXT = 7, {"train": 12, "eval": 8}  # batches taken before the save, and after it


class Square(grain.transforms.Map):
    def map(self, element):
        return {"index": element, "square": element * element}


class Noise(grain.transforms.RandomMap):
    def random_map(self, element, rng: np.random.Generator):
        return {**element, "noise": int(rng.integers(0, 1_000_000))}


def loaders() -> dict[str, grain.DataLoaderIterator]:
    source = grain.sources.RangeDataSource(0, RECORDS, 1)
    shard = grain.sharding.ShardByJaxProcess(drop_remainder=True)
    train = grain.DataLoader(
        data_source=source,
        sampler=grain.samplers.IndexSampler(len(source), shard, shuffle=True, num_epochs=2, seed=17),
        operations=[Square(), Noise(), grain.transforms.Batch(4)],
        worker_count=0,
    )
    evaluate = grain.DataLoader(
        data_source=source,
        sampler=grain.samplers.IndexSampler(len(source), shard, shuffle=False, num_epochs=1),
        operations=[Square(), grain.transforms.Batch(3)],
        worker_count=0,
    )
    return {"train": iter(train), "eval": iter(evaluate)}


def batches(iterator, count: int) -> list[dict[str, list[int]]]:
    return [{name: column.tolist() for name, column in next(iterator).items()} for _ in range(count)]


mesh = jax.make_mesh((args.count,), ("x",))
sharding = NamedSharding(mesh, P("x"))
weights = np.arange(8 * args.count * 16, dtype=np.float32).reshape(8 * args.count, 16)
report: dict = {"process": args.process}
with jaxstow.CheckpointManager(args.folder, process_timeout=60) as manager:
    live = loaders()
    if args.action == "save":
        report["first"] = {name: batches(iterator, SKIP) for name, iterator in live.items()}
        params = jax.make_array_from_callback(weights.shape, sharding, lambda index: weights[index])
        manager.save(1, {"params": params, "data": {"train": live["train"], "eval": jaxstow.per_process(live["eval"])}})
        manager.wait()
    else:
        like = {
            "params": jax.ShapeDtypeStruct(weights.shape, np.float32, sharding=sharding),
            "data": {"train": live["train"], "eval": jaxstow.per_process(live["eval"])},
        }
        restored = manager.restore(like=like)
        for shard in restored["params"].addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), weights[shard.index])
        report["live"] = {name: restored["data"][name] is live[name] for name in live}
    report["next"] = {name: batches(iterator, NEXT[name]) for name, iterator in live.items()}
print(json.dumps(report), flush=True)
jax.distributed.shutdown()
