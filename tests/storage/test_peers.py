"""Messages between real ``jax.distributed`` processes over the peer transport: delivered whole in any order, a
stopped peer ending every wait within the timeout, damaged bytes refused (``tests/distributed/peer_worker.py``)."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

from distributed_runs import launch

WORKER = Path(__file__).parents[1] / "distributed" / "peer_worker.py"


def _start(action: str, count: int, *extra: str) -> list[subprocess.Popen[str]]:
    return launch(WORKER, count, lambda index, port: [action, str(index), str(count), str(port), *extra])


def _report(process: subprocess.Popen[str]) -> dict:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, f"process failed ({process.returncode}):\n{out}\n{err[-3000:]}"
    return json.loads(out.strip().splitlines()[-1])


def test_every_process_receives_every_message_whole_in_any_order():
    reports = [_report(process) for process in _start("exchange", 3)]
    for report in reports:
        others = [k for k in range(3) if k != report["process"]]
        assert report["small"] == {str(k): f"from {k}" for k in others}
        assert report["large"] == {str(k): True for k in others}


def test_a_stopped_peer_makes_every_wait_for_it_raise_within_the_timeout():
    processes = _start("stall", 3, "--timeout", "2")
    try:
        reports = [_report(process) for process in processes[:2]]
    finally:
        processes[2].send_signal(signal.SIGKILL)
        processes[2].communicate()
    for report in reports:
        for what in ("receive", "send"):
            assert "process 2" in report[what]["error"]
            assert 1.5 < report[what]["seconds"] < 10
        assert "'never'" in report["receive"]["error"]
        assert "'large'" in report["send"]["error"]


def test_a_message_whose_bytes_do_not_match_its_checksum_is_refused():
    reports = [_report(process) for process in _start("corrupt", 2)]
    assert "'bad'" in reports[0]["bad"]["error"]
    assert "process 1" in reports[0]["bad"]["error"]
    assert "damaged" in reports[0]["bad"]["error"]
    assert reports[0]["good"] == 1000
