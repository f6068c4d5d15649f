"""A leaf read alone: its memory kept for the next leaf once its arrays are gone, never while one is alive, and every
leaf still verified against its checksum, a corrupt byte anywhere in it refused."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import jax
import numpy as np
import pytest

import jaxstow
from jaxstow._format import split_reads, tensor_reads
from jaxstow._format.block_checksums import BLOCK_BYTES
from jaxstow._format.split_reads import Balance
from jaxstow._storage.sources import LocalFile
from jaxstow._util import buffers, partner
from jaxstow.errors import CorruptFileError, StorageError

# Over the size read in two halves at once, its halves no multiple of a page.
SHAPE = (1027, 1031)
_FILL = LocalFile._fill


def _leaves(count: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"l{i}": rng.standard_normal(SHAPE, dtype=np.float32) for i in range(count)}


def _owner(array: np.ndarray) -> object:
    """What holds the memory under ``array``: the first base in its chain that is no array."""
    while isinstance(array, np.ndarray):
        array = array.base
    return array


@pytest.fixture
def saved(tmp_path):
    tree = _leaves(4)
    path = tmp_path / "leaves.jxs"
    jaxstow.save(path, tree)
    return path, tree


def test_leaves_read_one_by_one_and_let_go_reuse_one_buffer_and_are_right_each_time(saved):
    path, tree = saved
    buffers.release_kept()  # the buffers kept by earlier tests of this process could leave no room to keep one
    mappings = set()
    with jaxstow.open(path) as reader:
        for _ in range(3):
            for name, expected in tree.items():
                leaf = reader[name]
                np.testing.assert_array_equal(leaf, expected)
                assert leaf.ctypes.data % buffers.HUGE_PAGE == 0 and leaf.flags.writeable
                mappings.add(_owner(leaf).mapping)  # the memory itself, not its address, which a new mapping may take
                del leaf
                _given_back()
    assert len(mappings) == 1


def _given_back() -> None:
    """Wait until the memory of the leaf just let go is kept (at most 2 s): a thread of the read pool may still be
    leaving the job that read into it, on a loaded machine."""
    deadline = time.monotonic() + 2
    while not buffers._KEPT.held and time.monotonic() < deadline:
        time.sleep(0.001)


def test_memory_under_a_live_leaf_a_view_or_a_jax_array_is_never_read_into(saved):
    path, tree = saved
    with jaxstow.open(path) as reader:
        for name in tree:  # let go at once: their memory is kept for the reads below
            reader[name]
        kept = reader["l0"]
        view = reader["l1"][3:, ::2]
        on_device = jax.device_put(reader["l2"])
        others = [reader["l3"] for _ in range(3)]
        np.testing.assert_array_equal(kept, tree["l0"])
        np.testing.assert_array_equal(view, tree["l1"][3:, ::2])
        np.testing.assert_array_equal(np.asarray(on_device), tree["l2"])
        for other in others:
            np.testing.assert_array_equal(other, tree["l3"])
        assert len({id(_owner(leaf)) for leaf in (kept, view, *others)}) == 5


@pytest.mark.parametrize("fresh", [False, True], ids=["memory-let-go", "fresh-memory"])
def test_a_corrupt_byte_is_refused_in_memory_a_good_read_of_the_same_leaf_left(saved, tmp_path, monkeypatch, fresh):
    path, tree = saved
    data = bytearray(path.read_bytes())
    with jaxstow.open(path) as reader:
        slot = reader.container.slots["l2"]
    for balance in (split_reads.BLOCKS, split_reads.WHOLE):  # the cuts stay where they are
        monkeypatch.setattr(balance, "learn", lambda mine, theirs: None)
    cuts = [balance.cut(slot.nbytes) for balance in (split_reads.BLOCKS, split_reads.WHOLE)]  # where two parts meet
    block = BLOCK_BYTES  # each part is read and hashed block by block
    edges = (0, block - 1, block, 2 * block - 1, 2 * block, *(at + step for at in cuts for step in (-1, 0, block)))
    for at in sorted({at for at in (*edges, slot.nbytes - 1) if at < slot.nbytes}):  # the parts' and blocks' edges
        damaged = tmp_path / f"damaged-{at}.jxs"
        changed = bytearray(data)
        changed[slot.offset + at] ^= 0x10
        damaged.write_bytes(changed)
        with jaxstow.open(path) as good, jaxstow.open(damaged) as bad:
            np.testing.assert_array_equal(good["l2"], tree["l2"])  # dropped at once: its memory is kept
            if fresh:  # read on one thread, in pieces
                buffers.release_kept()
            with pytest.raises(CorruptFileError, match="checksum mismatch") as raised:
                bad["l2"]
            assert raised.value.path == "l2" and str(damaged) in str(raised.value)
            np.testing.assert_array_equal(bad["l1"], tree["l1"])


@pytest.mark.parametrize("nbytes", [4 << 20, (7 << 19) + 4, (6 << 20) - 12], ids=["4-blocks", "3.5-blocks", "6-blocks"])
@pytest.mark.parametrize("share", [Balance.LEAST, 0.5, Balance.MOST])
def test_a_leaf_read_in_two_parts_is_read_right_and_a_byte_damaged_anywhere_is_refused(
    tmp_path, monkeypatch, nbytes, share
):
    """Wherever the cut falls, on a block's edge or inside one (this thread then hashes the rest of that block, read by
    the partner), a good leaf's blocks all match, its whole checksum never needed, and a damaged byte is refused."""
    leaf = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    path = tmp_path / "even.jxs"
    jaxstow.save(path, {"a": leaf, "b": leaf[::-1].copy()})
    data = path.read_bytes()
    found = []
    split = tensor_reads.read_blocks_split
    monkeypatch.setattr(tensor_reads, "read_blocks_split", lambda *args: found.append(split(*args)) or found[-1])
    monkeypatch.setattr(split_reads.BLOCKS, "share", share)
    monkeypatch.setattr(split_reads.BLOCKS, "learn", lambda mine, theirs: None)  # the cut stays where it is
    cut = split_reads.BLOCKS.cut(nbytes)
    assert cut % 4096 == 0 and 0 < cut < nbytes
    buffers.release_kept()
    with jaxstow.open(path) as reader:
        offset = reader.container.slots["a"].offset
        for _ in range(3):  # fresh memory first, then the memory let go, read in two parts
            np.testing.assert_array_equal(reader["a"], leaf)
        assert found == [reader.stored["a"].blocks] * 2
    edge = cut // BLOCK_BYTES * BLOCK_BYTES  # the block the cut falls in
    for at in sorted({0, edge - 1, edge, cut - 1, cut, edge + BLOCK_BYTES - 1, edge + BLOCK_BYTES, nbytes - 1}):
        if not 0 <= at < nbytes:
            continue
        changed = bytearray(data)
        changed[offset + at] ^= 0x01
        damaged = tmp_path / f"damaged-{at}.jxs"
        damaged.write_bytes(changed)
        with jaxstow.open(damaged) as reader:
            np.testing.assert_array_equal(reader["b"], leaf[::-1])  # its memory let go: "a" is read in two parts
            with pytest.raises(CorruptFileError, match="checksum mismatch"):
                reader["a"]


def test_a_leaf_read_in_halves_from_a_file_written_in_place_since_it_was_opened_is_refused(saved):
    path, tree = saved
    with jaxstow.open(path) as reader:
        np.testing.assert_array_equal(reader["l0"], tree["l0"])  # let go: the next read is in halves at once
        data = bytearray(path.read_bytes())
        data[reader.container.slots["l1"].offset] ^= 0x10
        with open(path, "r+b") as file:  # the same file, written over in place
            file.write(data)
        os.utime(path, ns=(0, 0))
        with pytest.raises(StorageError, match="changed since it was opened"):
            reader["l1"]


def _read_threads(monkeypatch, *, partner_first: bool = False) -> list[str]:
    """The names of the threads that read from local files from now on, one per read (a leaf is read in pieces); with
    ``partner_first``, a read on the caller's thread waits until one has started on the partner thread."""
    threads: list[str] = []
    started = threading.Event()

    def recorded(self, offset, buffer):
        threads.append(threading.current_thread().name)
        if threading.current_thread().name == "jaxstow-partner":
            started.set()
        elif partner_first:
            assert started.wait(60), "no read started on the partner thread"
        _FILL(self, offset, buffer)

    monkeypatch.setattr(LocalFile, "_fill", recorded)
    return threads


def test_a_leaf_read_again_is_read_in_halves_at_once_and_right(saved, monkeypatch):
    path, tree = saved
    buffers.release_kept()
    caller = threading.current_thread().name
    with jaxstow.open(path) as reader:
        threads = _read_threads(monkeypatch)
        np.testing.assert_array_equal(reader["l0"], tree["l0"])  # fresh memory: read on this thread alone
        assert set(threads) == {caller}
        for name in ("l0", "l1"):  # the memory the first read let go: its pages in place
            threads = _read_threads(monkeypatch, partner_first=True)
            np.testing.assert_array_equal(reader[name], tree[name])
            assert set(threads) == {caller, "jaxstow-partner"}


@pytest.mark.parametrize("mib", [3, 30.5, 31.9])
def test_a_leaf_of_any_size_read_in_halves_is_read_so_again(tmp_path, monkeypatch, mib):
    """Up to 32 MiB, a leaf's memory is kept for the next read, which is then in halves: a leaf of 30 to 32 MiB,
    whose buffer holds 34 MiB, too."""
    leaf = np.random.default_rng(1).integers(0, 255, int(mib * (1 << 20)), dtype=np.uint8)
    jaxstow.save(tmp_path / "leaf.jxs", {"x": leaf})
    buffers.release_kept()
    with jaxstow.open(tmp_path / "leaf.jxs") as reader:
        np.testing.assert_array_equal(reader["x"], leaf)  # fresh memory, let go: kept
        threads = _read_threads(monkeypatch, partner_first=True)
        np.testing.assert_array_equal(reader["x"], leaf)
    assert set(threads) == {threading.current_thread().name, "jaxstow-partner"}


@pytest.mark.parametrize("blocks", [True, False], ids=["by-blocks", "whole-checksum"])
def test_a_leaf_read_while_the_partner_thread_is_busy_is_read_whole_by_its_caller(saved, monkeypatch, blocks):
    path, tree = saved
    begun, release = threading.Event(), threading.Event()
    running = partner.hand(lambda: (begun.set(), release.wait(60)))
    assert running is not None and begun.wait(60)
    waiting = partner.hand(lambda: None)  # waits for the job running
    assert waiting is not None
    try:
        with jaxstow.open(path) as reader:
            reader["l0"]  # the memory kept: the next reads are in halves
            names = ("l1", "l2")
            if not blocks:  # leaves without the checksums of their blocks (files of jaxstow 0.1): hashed whole
                for name in names:
                    reader.stored[name] = reader.stored[name]._replace(blocks=None)
            threads = _read_threads(monkeypatch)
            for name in names:
                np.testing.assert_array_equal(reader[name], tree[name])
    finally:
        release.set()
        running.result()
    assert set(threads) == {threading.current_thread().name}
    assert waiting.cancel() or waiting.result() is None


def test_the_memory_kept_is_bounded(tmp_path):
    sizes = [(1 << 20) * mib + 4 for mib in (2, 3, 5, 9, 17, 33)]
    path = tmp_path / "sizes.jxs"
    jaxstow.save(path, {f"s{size}": np.ones(size, np.uint8) for size in sizes})
    with jaxstow.open(path) as reader:
        for _ in range(2):
            leaves = [reader[f"s{size}"] for size in sizes for _ in range(3)]
            assert all(leaf.all() for leaf in leaves)
            del leaves
            assert buffers._KEPT.held <= buffers.KEPT_BYTES
            assert max(buffers._KEPT.sizes, default=0) <= buffers.LARGEST_KEPT


def _run(script: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, env=env, timeout=60
    )


def test_a_leaf_alive_at_exit_and_a_forked_child_leave_no_trace(saved):
    path, _ = saved
    done = _run(
        f"""
        import os, jaxstow
        from jaxstow._util import buffers, partner
        reader = jaxstow.open({str(path)!r})
        dropped, kept = reader["l0"], reader["l1"]
        del dropped
        assert buffers._KEPT.held > 0
        child = os.fork()
        if child == 0:
            os._exit(0 if buffers._KEPT.held == 0 and kept.sum() == kept.sum() else 3)
        assert os.waitpid(child, 0)[1] == 0
        print("ok")
        """
    )
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_leaf_let_go_inside_a_collection_under_the_lock_is_kept_without_a_deadlock(saved):
    """A collection that an allocation under the lock starts can free a leaf held only by a cycle."""
    path, _ = saved
    done = _run(
        f"""
        import gc, jaxstow
        from jaxstow._util import buffers, partner
        buffers.release_kept()
        with jaxstow.open({str(path)!r}) as reader:
            cycle = [reader["l0"]]
        cycle.append(cycle)
        del cycle
        with buffers._KEPT.lock:
            gc.collect()
        print(buffers._KEPT.held > 0)
        """
    )
    assert done.stdout == "True\n", done.stderr
