"""Object-store benchmarks: jaxstow against an S3 server (SeaweedFS on this machine's loopback, started by the bench),
next to bare clients doing the same requests and to runai-model-streamer reading the same object.

Reads of a 1 GiB jaxstow file (64 float32 leaves of 16 MiB; a valid safetensors file), as parallel ranged GETs of
``--part-mib`` MiB, ``--requests`` in flight, landing in numpy arrays:

- bare clients landing the bytes in fresh memory, as a restore must (the fastest of them is the limit): botocore, each
  GET read from its socket into the buffer; botocore through urllib3's ``readinto``; obstore (``get_range_async``
  gathered on one event loop, then copied into place: its buffers are read-only and unaligned); s3fs (``cat_file`` on
  threads, copied); and, as the network's ceiling, botocore into a buffer allocated before the clock starts (here a
  first touch of fresh memory costs about 0.7 CPU-s per GiB: this machine is a virtual one);
- ``jaxstow.load(url, as_numpy=True)``; runai-model-streamer's ``SafetensorsStreamer`` with the same concurrency and
  chunk size; a step of 64 items of 1 to 32 MiB (as many bytes in all) restored by ``CheckpointManager.restore``; a step saved by 4
  ``jax.distributed`` processes (its item file and the 3 part files of the others, 1 GiB of row-sharded leaves)
  restored whole in this one process.

Writes of the same 1 GiB: bare multipart uploads (botocore, parts on threads; obstore's ``put``), ``jaxstow.save``
and the 64-item step saved by ``CheckpointManager.save``.

Every round runs the methods in a shuffled order; the table gives medians, the client's CPU seconds (this process, all
threads, runai's included) and the server's (SeaweedFS's process): on 2 cores they compete. Ratios are paired: each
round's method against that round's limit (the fastest bare client), then the median. Targets: the single file, the
64-item step and the 4-process step restore >= 0.8x the limit, the single file no slower than runai; the save >= 0.8x
the fastest bare multipart upload.

Run: ``python bench/bench_object_store.py [--rounds N] [--mib N] [--requests N] [--part-mib N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

MiB = 1 << 20
LEAF = 16 * MiB
HERE = Path(__file__).parent


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _aligned(nbytes: int) -> np.ndarray:
    raw = np.empty(nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start : start + nbytes]


class _Body:
    """A part of a buffer as a request body, read without copying it first."""

    def __init__(self, view: memoryview) -> None:
        self._view, self._at = view, 0

    def read(self, count: int = -1) -> bytes:
        end = len(self._view) if count is None or count < 0 else min(len(self._view), self._at + count)
        data = bytes(self._view[self._at : end])
        self._at = end
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        self._at = offset if whence == 0 else self._at + offset if whence == 1 else len(self._view) + offset
        return self._at

    def tell(self) -> int:
        return self._at


class Bare:
    """The same requests as jaxstow's, made by bare clients."""

    def __init__(self, endpoint: str, bucket: str, requests: int, part: int) -> None:
        import botocore.config
        import botocore.session

        self.bucket, self.requests, self.part = bucket, requests, part
        self.botocore = botocore.session.get_session().create_client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="jaxstow",
            aws_secret_access_key="jaxstow",
            region_name="us-east-1",
            config=botocore.config.Config(max_pool_connections=2 * requests, s3={"payload_signing_enabled": False}),
        )
        self.pool = ThreadPoolExecutor(requests)
        from obstore.store import S3Store

        self.obstore = S3Store(
            bucket,
            config={
                "endpoint": endpoint,
                "access_key_id": "jaxstow",
                "secret_access_key": "jaxstow",
                "region": "us-east-1",
            },
            client_options={"allow_http": True},
        )
        self.loop = asyncio.new_event_loop()  # one loop for every gather: asyncio.run would repr every Bytes result
        import s3fs

        self.s3fs = s3fs.S3FileSystem(
            key="jaxstow",
            secret="jaxstow",
            client_kwargs={"endpoint_url": endpoint},
            config_kwargs={"max_pool_connections": requests},
        )

    def _ranges(self, size: int) -> list[tuple[int, int]]:
        return [(start, min(self.part, size - start)) for start in range(0, size, self.part)]

    def botocore_into(self, key: str, buffer: np.ndarray, *, through_urllib3: bool = False) -> np.ndarray:
        view = memoryview(buffer)

        def get(start: int, length: int) -> None:
            body = self.botocore.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{start + length - 1}")[
                "Body"
            ]
            raw = body._raw_stream
            stream = raw if through_urllib3 else raw._fp
            done = 0
            while done < length:
                done += stream.readinto(view[start + done : start + length])
            if not through_urllib3:
                raw.release_conn()

        list(self.pool.map(lambda r: get(*r), self._ranges(len(buffer))))
        return buffer

    def obstore_into(self, key: str, buffer: np.ndarray) -> np.ndarray:
        import obstore

        async def gather() -> list[Any]:
            gate = asyncio.Semaphore(self.requests)

            async def one(start: int, length: int) -> Any:
                async with gate:
                    return await obstore.get_range_async(self.obstore, key, start=start, length=length)

            return await asyncio.gather(*(one(*r) for r in self._ranges(len(buffer))))

        for (start, length), part in zip(
            self._ranges(len(buffer)), self.loop.run_until_complete(gather()), strict=True
        ):
            buffer[start : start + length] = np.frombuffer(part, np.uint8)
        return buffer

    def s3fs_into(self, key: str, buffer: np.ndarray) -> np.ndarray:
        def get(start: int, length: int) -> None:
            buffer[start : start + length] = np.frombuffer(
                self.s3fs.cat_file(f"{self.bucket}/{key}", start=start, end=start + length), np.uint8
            )

        list(self.pool.map(lambda r: get(*r), self._ranges(len(buffer))))
        return buffer

    def botocore_upload(self, key: str, data: np.ndarray) -> None:
        view = memoryview(data)
        upload = self.botocore.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]

        def put(number: int, start: int, length: int) -> dict[str, Any]:
            answer = self.botocore.upload_part(
                Bucket=self.bucket,
                Key=key,
                UploadId=upload,
                PartNumber=number,
                Body=_Body(view[start : start + length]),
                ContentLength=length,
            )
            return {"PartNumber": number, "ETag": answer["ETag"]}

        parts = list(self.pool.map(lambda n_r: put(n_r[0] + 1, *n_r[1]), enumerate(self._ranges(len(data)))))
        self.botocore.complete_multipart_upload(
            Bucket=self.bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
        )

    def obstore_upload(self, key: str, data: np.ndarray) -> None:
        import obstore

        obstore.put(self.obstore, key, memoryview(data), chunk_size=self.part, max_concurrency=self.requests)


def _item_sizes(count: int, total: int) -> list[int]:
    """Bytes of ``count`` items spread evenly from 1 to 32 MiB, those in the middle trimmed to add up to ``total``.

    >>> sizes = _item_sizes(64, 1024 * MiB)
    >>> len(sizes), sum(sizes) == 1024 * MiB, min(sizes) == MiB, max(sizes) == 32 * MiB
    (64, True, True, True)
    """
    sizes = [(1 + i * 31 // max(1, count - 1)) * MiB for i in range(count)]
    excess = sum(sizes) - total
    for i in range(count // 2, count):
        cut = max(0, min(excess, sizes[i] - MiB))
        sizes[i] -= cut
        excess -= cut
    return sizes


def _runai(url: str, requests: int, part: int) -> dict[str, np.ndarray]:
    from runai_model_streamer import SafetensorsStreamer

    os.environ.update(RUNAI_STREAMER_CONCURRENCY=str(requests), RUNAI_STREAMER_CHUNK_BYTESIZE=str(part))
    out = {}
    with SafetensorsStreamer() as streamer:
        streamer.stream_file(url)
        for name, tensor in streamer.get_tensors():
            out[name] = tensor.numpy()
    return out


def _save_parts(url: str, port: int, endpoint: str, mib: int, transfer: Any) -> None:
    """Save step 1 of a tree of ``mib`` MiB, row-sharded over 4 processes of one device each, to ``url``."""
    environment = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}
    command = [
        sys.executable,
        __file__,
        "--save-part",
        "PROCESS",
        str(port),
        url,
        endpoint,
        str(mib),
        str(transfer.requests),
        str(transfer.part_size),
    ]
    processes = [
        subprocess.Popen([str(index) if arg == "PROCESS" else arg for arg in command], env=environment)
        for index in range(4)
    ]
    for process in processes:
        if process.wait(timeout=600) != 0:
            raise SystemExit("a process saving the 4-process step failed")


def _part_worker(argv: list[str]) -> None:
    index, port, url, endpoint, mib, requests, part = argv
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=4, process_id=int(index))
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxstow

    mesh = jax.make_mesh((4,), ("x",))
    side = int(np.sqrt(LEAF // 4))
    leaves = {}
    for leaf in range(int(mib) // 16):
        values = np.random.default_rng(leaf).standard_normal((side, side), dtype=np.float32)
        leaves[f"w{leaf:02d}"] = jax.make_array_from_callback(
            values.shape, NamedSharding(mesh, P("x")), lambda i, v=values: v[i]
        )
    options = {"key": "jaxstow", "secret": "jaxstow", "client_kwargs": {"endpoint_url": endpoint}}
    transfer = jaxstow.Transfer(requests=int(requests), part_size=int(part))
    with jaxstow.CheckpointManager(url, storage_options=options, transfer=transfer, process_timeout=300) as manager:
        manager.save(1, {"params": leaves})
    jax.distributed.shutdown()


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _rounds(
    methods: dict[str, Callable[[], Any]], rounds: int, server: Any, warm: int
) -> dict[str, list[tuple[float, float, float]]]:
    from timing import warm_memory

    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in methods}
    for _ in range(rounds):
        order = list(methods)
        random.shuffle(order)
        for name in order:
            warm_memory(warm)
            cpu, served, start = _cpu(), server.cpu_seconds(), time.perf_counter()
            result = methods[name]()
            samples[name].append((time.perf_counter() - start, _cpu() - cpu, server.cpu_seconds() - served))
            del result
    return samples


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--save-part":
        _part_worker(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--part-mib", type=int, default=16)
    args = parser.parse_args()
    sys.path[:0] = [str(HERE), str(HERE.parent / "tests" / "support")]  # the S3 server is the tests' own
    from seaweed import seaweed
    from timing import format_table

    import jaxstow

    part = args.part_mib * MiB
    transfer = jaxstow.Transfer(requests=args.requests, part_size=part)
    loads = [os.getloadavg()[0]]
    with seaweed() as server:
        os.environ.update(
            AWS_ENDPOINT_URL=server.endpoint,
            AWS_ACCESS_KEY_ID="jaxstow",
            AWS_SECRET_ACCESS_KEY="jaxstow",
            AWS_REGION="us-east-1",
            AWS_EC2_METADATA_DISABLED="true",
            RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0",
        )
        options = server.storage_options
        count = args.mib * MiB // LEAF
        tree = {
            f"w{i:02d}": np.random.default_rng(i).standard_normal(LEAF // 4, dtype=np.float32) for i in range(count)
        }
        one, step, parts = server.url("one.jxs"), server.url("step"), server.url("parts")
        jaxstow.save(one, tree, storage_options=options, transfer=transfer)
        sizes = _item_sizes(count, count * LEAF)
        random.Random(1).shuffle(sizes)
        with jaxstow.CheckpointManager(step, storage_options=options, transfer=transfer) as manager:
            manager.save(
                1,
                {
                    f"item{i:02d}": {"w": np.random.default_rng(i).standard_normal(nbytes // 4, dtype=np.float32)}
                    for i, nbytes in enumerate(sizes)
                },
            )
        _save_parts(parts, _free_port(), server.endpoint, args.mib, transfer)
        size = jaxstow.open(one, storage_options=options).containers[0].source.size
        bare = Bare(server.endpoint, server.bucket, args.requests, part)
        preallocated = _aligned(size)
        got = jaxstow.load(one, storage_options=options, transfer=transfer, as_numpy=True)
        assert all(np.array_equal(got[name], tree[name]) for name in tree)
        assert all(np.array_equal(leaf, tree[name]) for name, leaf in _runai(one, args.requests, part).items())
        del got

        def restore(url: str) -> Any:
            with jaxstow.CheckpointManager(url, storage_options=options, transfer=transfer) as manager:
                return manager.restore(as_numpy=True)

        reads: dict[str, Callable[[], Any]] = {
            "ceiling: botocore, socket -> buffer allocated before": lambda: bare.botocore_into("one.jxs", preallocated),
            "bare: botocore, socket -> fresh buffer": lambda: bare.botocore_into("one.jxs", _aligned(size)),
            "bare: botocore, urllib3 readinto": lambda: bare.botocore_into(
                "one.jxs", _aligned(size), through_urllib3=True
            ),
            "bare: obstore, gathered + copy": lambda: bare.obstore_into("one.jxs", _aligned(size)),
            "bare: s3fs, cat_file on threads + copy": lambda: bare.s3fs_into("one.jxs", _aligned(size)),
            "jaxstow.load -> numpy": lambda: jaxstow.load(
                one, storage_options=options, transfer=transfer, as_numpy=True
            ),
            "runai-model-streamer": lambda: _runai(one, args.requests, part),
            "jaxstow restore: step of 64 items": lambda: restore(step),
            "jaxstow restore: 4-process step, part files": lambda: restore(parts),
        }
        whole = np.concatenate([leaf.view(np.uint8) for leaf in tree.values()])
        writes: dict[str, Callable[[], Any]] = {
            "bare: botocore multipart": lambda: bare.botocore_upload("bare.bin", whole),
            "bare: obstore.put": lambda: bare.obstore_upload("bare-obstore.bin", whole),
            "jaxstow.save": lambda: jaxstow.save(
                server.url("saved.jxs"), tree, storage_options=options, transfer=transfer
            ),
        }
        read_samples = _rounds(reads, args.rounds, server, size)
        write_samples = _rounds(writes, args.rounds, server, 0)
    loads.append(os.getloadavg()[0])
    _report(read_samples, write_samples, size, args, loads, format_table)


def _report(
    reads: dict[str, list[Any]], writes: dict[str, list[Any]], size: int, args: Any, loads: list[float], table: Any
) -> None:
    def best(samples: dict[str, list[Any]], prefix: tuple[str, ...]) -> list[float]:
        bare = [name for name in samples if name.startswith(prefix)]
        return [min(samples[name][r][0] for name in bare) for r in range(args.rounds)]

    read_limit, write_limit = best(reads, ("bare",)), best(writes, ("bare",))
    rows = []
    ratio: dict[str, float] = {}
    for samples, limit in ((reads, read_limit), (writes, write_limit)):
        for name, runs in samples.items():
            seconds = statistics.median(run[0] for run in runs)
            ratio[name] = statistics.median(limit[r] / runs[r][0] for r in range(len(runs)))
            rows.append(
                [
                    name,
                    f"{size / seconds / 1e9:.2f}",
                    f"{seconds:.2f}",
                    f"{statistics.median(run[1] for run in runs):.2f}",
                    f"{statistics.median(run[2] for run in runs):.2f}",
                    f"{ratio[name]:.2f}x",
                ]
            )
    print(
        f"bench_object_store: {size / 2**30:.2f} GiB, {args.requests} requests of {args.part_mib} MiB, "
        f"{args.rounds} rounds, load average {loads[0]:.1f} at the start, {loads[1]:.1f} at the end"
    )
    print(table(["method", "GB/s", "seconds", "client CPU-s", "server CPU-s", "vs limit"], rows))

    def verdict(value: float, floor: float) -> str:
        return f"{value:.2f}x (>= {floor}: {'PASS' if value >= floor else 'MISS'})"

    runai = statistics.median(
        reads["runai-model-streamer"][r][0] / reads["jaxstow.load -> numpy"][r][0] for r in range(args.rounds)
    )
    print(
        f"targets: single file {verdict(ratio['jaxstow.load -> numpy'], 0.8)} of the limit, "
        f"{verdict(runai, 1.0)} runai's speed; step of 64 items {verdict(ratio['jaxstow restore: step of 64 items'], 0.8)}; "
        f"4-process step {verdict(ratio['jaxstow restore: 4-process step, part files'], 0.8)}; "
        f"save {verdict(ratio['jaxstow.save'], 0.8)} of a bare multipart upload"
    )


if __name__ == "__main__":
    main()
