"""A reader shared between threads: closed in one while another reads, the reads in flight end on the file they
began on, and the next ones raise ``ClosedError``, never bytes of a file opened meanwhile under the same descriptor."""

from __future__ import annotations

import os
import threading
import time

import numpy as np

import jaxstow
from jaxstow.errors import ClosedError


def test_a_reader_closed_while_another_thread_reads_slices_never_gives_another_files_bytes(tmp_path):
    path, other = tmp_path / "w.jxs", tmp_path / "other.bin"
    jaxstow.save(path, {"w": np.ones((2000, 500), np.float32)})
    other.write_bytes(np.full(os.path.getsize(path) // 4 + 16, 7.0, np.float32).tobytes())
    outcomes: list[str] = []
    for _ in range(10):
        reader = jaxstow.open(path)
        started = threading.Event()

        def read(reader: jaxstow.Reader, started: threading.Event) -> None:
            started.set()
            for n in range(100_000):
                try:
                    part = reader.read("w", np.s_[n % 1500 : n % 1500 + 400, :])
                except ClosedError:
                    outcomes.append("closed")
                    return
                if not np.all(part == 1.0):
                    outcomes.append("another file's bytes")
                    return

        thread = threading.Thread(target=read, args=(reader, started))
        thread.start()
        started.wait()
        time.sleep(0.01)
        reader.close()
        descriptors = [os.open(other, os.O_RDONLY) for _ in range(4)]  # the closed descriptor's number, given again
        thread.join(30)
        for descriptor in descriptors:
            os.close(descriptor)
    assert outcomes == ["closed"] * 10
