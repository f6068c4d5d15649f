"""A leaf read in two parts at once: the cut moves toward the thread that is faster, wherever it falls the values and
checksums are right, and a thread that keeps being slow ends with the least share."""

from __future__ import annotations

import io
import threading
import time

import numpy as np
import pytest
from xxhash import xxh3_64_hexdigest

import jaxstow
from jaxstow._format import split_reads
from jaxstow._format.split_reads import Balance, hashed_blocks, read_and_hash_split, read_blocks_split
from jaxstow._storage.opening import open_source
from jaxstow._storage.sources import LocalFile
from jaxstow._util import buffers

_FILL = LocalFile._fill


@pytest.mark.parametrize("nbytes", [(3 << 20) + 5, 4 << 20, (6 << 20) - 12])
@pytest.mark.parametrize("share", [Balance.LEAST, 0.3, 0.5, 0.77, Balance.MOST])
def test_every_cut_reads_every_byte_and_gives_the_checksums_of_one_read(nbytes, share):
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    for read, expected in (
        (read_blocks_split, hashed_blocks(data.data)),
        (read_and_hash_split, xxh3_64_hexdigest(data)),
    ):
        into = np.zeros_like(data)
        balance = Balance(share)
        assert read(open_source(io.BytesIO(data.tobytes())), 0, into.data, balance) == expected
        np.testing.assert_array_equal(into, data)


def test_a_balance_gives_the_partner_less_while_it_ends_later_and_more_while_it_ends_sooner():
    balance = Balance(0.5)
    shares = []
    for _ in range(40):
        balance.learn(1.0, 2.0)
        shares.append(balance.share)
    assert shares == sorted(shares, reverse=True) and shares[-1] == Balance.LEAST
    for _ in range(40):
        balance.learn(2.0, 1.0)
    assert balance.share == Balance.MOST
    balance.learn(0.0, 1.0)  # a part that took no time measurable teaches nothing
    assert balance.share == Balance.MOST
    assert 0 < balance.cut(3 << 20) < 3 << 20 and balance.cut(3 << 20) % 4096 == 0


@pytest.mark.parametrize("slow", ["jaxstow-partner", "MainThread"])
def test_reads_of_a_leaf_move_the_cut_away_from_a_thread_slowed_down_and_stay_right(tmp_path, monkeypatch, slow):
    """Each read on the slowed thread waits 2 ms: within 40 reads the slowed thread's share falls to the least (to
    near it, where the machine's load slows the other thread too at times)."""
    leaf = np.random.default_rng(3).standard_normal((1024, 1031), dtype=np.float32)
    jaxstow.save(tmp_path / "leaf.jxs", {"x": leaf})

    def slowed(self, offset, buffer):
        if threading.current_thread().name == slow:
            time.sleep(0.002)
        _FILL(self, offset, buffer)

    monkeypatch.setattr(split_reads.BLOCKS, "share", 0.5)
    buffers.release_kept()
    with jaxstow.open(tmp_path / "leaf.jxs") as reader:
        np.testing.assert_array_equal(reader["x"], leaf)  # fresh memory, on this thread; let go: kept
        monkeypatch.setattr(LocalFile, "_fill", slowed)
        bound = Balance.MOST if slow == "MainThread" else Balance.LEAST
        for _ in range(40):
            np.testing.assert_array_equal(reader["x"], leaf)
            if split_reads.BLOCKS.share == bound:
                break
    assert abs(split_reads.BLOCKS.share - bound) < 0.1, split_reads.BLOCKS.share  # from 0.5
