"""The peer transport between real ``jax.distributed`` processes (``tests/distributed/peer_worker.py``): messages
delivered whole in any order, a stopped or killed peer ending every wait within the timeout, and strangers on the
network (random bytes, the previous wire format, hellos without the secret, a 1 TiB length, connect-and-drop, a
flood of idle connections) changing nothing and allocating nothing in the process they attack; a replaced process
fetching only the bytes it reads."""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import secrets
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest
from distributed_runs import launch

from jaxstow._storage.peers import PeerTransport
from jaxstow.checkpoint.peer_reads import PeerFile, ask, serve_files
from jaxstow.errors import CheckpointError

WORKER = Path(__file__).parents[1] / "distributed" / "peer_worker.py"
TIB = 1 << 40
# The wire format, as docs/safety.md and jaxstow._storage.peer_wire describe it, written out again here.
CHALLENGE, HELLO, FRAME = struct.Struct("!4s16s"), struct.Struct("!4sII16s32s"), struct.Struct("!QBHQ")
OLD_HEADER = struct.Struct("!4sIIQ16s")  # the format before: magic, source, tag length, payload length, xxh3


def _start(action: str, count: int, folder: Path, *extra: str) -> list[subprocess.Popen[str]]:
    return launch(WORKER, count, lambda index, port: [action, str(index), str(count), str(port), str(folder), *extra])


def _line(process: subprocess.Popen[str]) -> dict:
    line = process.stdout.readline()  # type: ignore[union-attr]
    assert line, f"the process printed nothing:\n{process.stderr.read()[-3000:]}"  # type: ignore[union-attr]
    return json.loads(line)


def _report(process: subprocess.Popen[str]) -> dict:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, f"process failed ({process.returncode}):\n{out}\n{err[-3000:]}"
    return json.loads(out.strip().splitlines()[-1])


def _sizes(folder: Path) -> dict[str, int]:
    return {str(path.relative_to(folder)): path.stat().st_size for path in sorted(folder.rglob("*")) if path.is_file()}


def _killed(processes: list[subprocess.Popen[str]]) -> None:
    for process in processes:
        process.kill()
        process.communicate()


@pytest.fixture
def pair():
    """Two ends of a run of two processes, in this process."""
    key = secrets.token_bytes(32)
    ends = [PeerTransport(index, 2, secret=key, timeout=2, host="127.0.0.1") for index in range(2)]
    for end in ends:
        end.connect([ends[0].address, ends[1].address])
    yield ends
    for end in ends:
        end.close()


def test_a_run_whose_coordinator_is_on_ipv6_listens_on_its_interface(monkeypatch):
    # The probe of the route to the coordinator was IPv4 only: for [::1] it fell back to the host name's address, a
    # LAN interface, where the run is on loopback.
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    import jax._src.distributed as distributed

    from jaxstow._storage.peer_wire import reachable_host

    monkeypatch.setattr(distributed.global_state, "coordinator_address", "[::1]:1234")
    monkeypatch.delenv("JAXSTOW_PEER_HOST", raising=False)
    assert reachable_host() == "::1"
    key = secrets.token_bytes(32)
    ends = [PeerTransport(index, 2, secret=key, timeout=2, host="::1") for index in range(2)]
    try:
        assert all(end.address.startswith("[::1]:") for end in ends)
        for end in ends:
            end.connect([ends[0].address, ends[1].address])
        arrived = ends[1].expect(0, "hello", limit=10)
        ends[0].send(1, "hello", b"over ipv6")
        assert arrived.wait() == b"over ipv6"
    finally:
        for end in ends:
            end.close()


def test_a_message_longer_than_its_receiver_asked_for_is_refused_unread(pair):
    one, two = pair
    small = two.expect(0, "small", limit=10)
    with pytest.raises(CheckpointError):  # the receiver drops the connection once the header says 8 MiB
        one.send(1, "small", bytes(8 << 20))
    with pytest.raises(CheckpointError, match=r"'small' between process 1 and process 0 was refused: 8388608 bytes"):
        small.wait()
    assert two.received == 0
    again = two.expect(0, "again", limit=10)
    one.send(1, "again", b"fine")  # a new connection, proved again
    assert again.wait() == b"fine"


def test_a_process_that_does_not_prove_the_secret_gets_no_byte(pair):
    one = pair[0]
    stranger = PeerTransport(1, 2, secret=secrets.token_bytes(32), timeout=2, host="127.0.0.1")
    one.connect([one.address, stranger.address])  # another program took process 1's port
    with pytest.raises(CheckpointError, match="did not take a proved connection within 2 s"):
        one.send(1, "weights", b"secret bytes")
    assert stranger.refused >= 1 and stranger.received == 0  # every try refused, nothing taken
    stranger.close()


def test_a_stranger_sending_its_hello_a_byte_at_a_time_is_dropped_by_the_handshakes_deadline(pair):
    target = pair[1]  # its timeout: 2 s, for the whole hello (each byte waited for 2 s kept it for minutes)
    host, _, port = target.address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as stranger:
        assert len(stranger.recv(CHALLENGE.size)) > 0
        start, dropped = time.monotonic(), None
        stranger.settimeout(0.25)
        while dropped is None and time.monotonic() - start < 12:
            try:
                stranger.sendall(b"J")  # a byte of a hello every quarter second: each well within 2 s
                if stranger.recv(1) == b"":
                    dropped = time.monotonic() - start
            except TimeoutError:
                continue
            except OSError:
                dropped = time.monotonic() - start
    assert dropped is not None and dropped < 6, dropped
    assert target.refused >= 1 and target.received == 0


def test_files_are_served_by_ranges_and_only_from_committed_steps(pair, tmp_path):
    one, two = pair
    (tmp_path / "5").mkdir()
    (tmp_path / "5" / "params.safetensors").write_bytes(bytes(range(256)) * 4096)

    def locate(owner, step, file, version):
        if (owner, step, version) != (0, 5, "v"):
            raise FileNotFoundError(f"process {owner}'s step {step} is not committed here")
        return str(tmp_path / str(step) / file)

    serve_files(one, locate)
    remote = PeerFile(two, 0, 0, 5, "v", "params.safetensors")
    assert remote.size == 1 << 20 and remote.read(1000, 300) == (bytes(range(256)) * 4)[1000 % 256 :][:300]
    with open(tmp_path / "copy", "wb") as sink:
        assert (
            ask(two, 0, {"owner": 0, "step": 5, "version": "v", "file": "params.safetensors"}, sink=sink, limit=2 << 20)
            == 1 << 20
        )
    assert (tmp_path / "copy").read_bytes() == (tmp_path / "5" / "params.safetensors").read_bytes()
    with pytest.raises(CheckpointError, match="at most 1000 expected"):
        ask(two, 0, {"owner": 0, "step": 5, "version": "v", "file": "params.safetensors"}, limit=1000)
    for wanted, problem in [
        ({"owner": 0, "step": 5, "version": "v", "file": "../5/params.safetensors"}, "is not the name of a file"),
        ({"owner": 1, "step": 5, "version": "v", "file": "params.safetensors"}, "not committed here"),
        ({"owner": 0, "step": 5, "version": "w", "file": "params.safetensors"}, "not committed here"),  # another save
        (
            {"owner": 0, "step": 5, "version": "v", "file": "params.safetensors", "offset": 1 << 20, "length": 1},
            "not 1 at offset",
        ),
    ]:
        with pytest.raises(CheckpointError, match=problem):
            ask(two, 0, wanted, limit=10)
    assert two.received == (1 << 20) + 300 + 8  # the range, the file and its size, nothing refused


def test_a_file_goes_to_disk_through_buffers_of_its_own_not_of_its_size(pair, tmp_path):
    one, two = pair
    source, copy = tmp_path / "source", tmp_path / "copy"
    with open(source, "wb") as file:
        file.truncate(128 << 20)
    peak, done = [_status(os.getpid())["VmRSS"]], threading.Event()

    def sample():
        while not done.wait(0.005):
            peak.append(_status(os.getpid())["VmRSS"])

    sampler = threading.Thread(target=sample)
    sampler.start()
    with open(copy, "wb") as sink:
        pending = two.expect(0, "file", limit=1 << 30, sink=sink)
        one.send_file(1, "file", str(source))
        assert pending.wait() == 128 << 20
    done.set()
    sampler.join()
    assert max(peak) - peak[0] < 16 << 10, (peak[0], max(peak))  # kB: a few MiB of buffers, not 128 MiB
    assert copy.stat().st_size == 128 << 20


def test_every_process_receives_every_message_whole_in_any_order(tmp_path):
    reports = [_report(process) for process in _start("exchange", 3, tmp_path)]
    for report in reports:
        others = [k for k in range(3) if k != report["process"]]
        assert report["small"] == {str(k): f"from {k}" for k in others}
        assert report["large"] == {str(k): True for k in others}


def test_a_stopped_peer_makes_every_wait_for_it_raise_within_the_timeout(tmp_path):
    processes = _start("stall", 3, tmp_path, "--timeout", "2")
    try:
        reports = [_line(process) for process in processes[:2]]
    finally:
        _killed(processes)
    for report in reports:
        for what in ("receive", "send"):
            assert "process 2" in report[what]["error"]
            assert 1.5 < report[what]["seconds"] < 10
        assert "'never'" in report["receive"]["error"]
        assert "'large'" in report["send"]["error"]


@pytest.mark.parametrize("kind", ["KILL", "STOP"])
def test_a_keeper_killed_or_stopped_while_copying_makes_the_others_raise_within_the_timeout(tmp_path, kind):
    processes = _start("copy", 3, tmp_path, "--victim", "1", "--signal", kind, "--timeout", "3")
    try:
        line = _line(processes[1])
        assert line.get("stopping"), line
        reports = [_line(processes[k]) for k in (0, 2)]
    finally:
        _killed(processes)
    for report in reports:
        assert "process 1" in report["save"]["error"], report  # process 0 sends to it, process 2 keeps its copy
        assert report["save"]["seconds"] < 3 * 3, report
    # Nothing half-committed: process 2 commits no copy of process 1's files, or only one equal to them.
    copy, own = tmp_path / "local2" / "process-2" / "peer-copies" / "p1" / "1", tmp_path / "local1" / "process-1" / "1"
    if copy.exists():
        files = sorted(path.name for path in own.iterdir() if path.suffix == ".safetensors")
        assert files, _sizes(own)
        for name in files:
            assert (copy / name).read_bytes() == (own / name).read_bytes(), (reports, _sizes(copy), _sizes(own))


def test_a_replaced_process_fetches_only_the_bytes_it_reads(tmp_path):
    reports = [_report(process) for process in _start("replaced", 3, tmp_path, "--victim", "1", "--timeout", "20")]
    assert [report["restored"] for report in reports] == [1, 1, 1]  # each checked every value it holds
    replaced = reports[1]
    assert replaced["own"] == ["checkpoint.json", "params.p1.safetensors"]  # its own files back in its local tier
    assert replaced["received"] <= 1.1 * replaced["share"], replaced
    for report in (reports[0], reports[2]):  # the others hold their own files: headers of the rest, nothing more
        assert report["received"] <= 0.1 * report["share"], report


# -- strangers on the network ---------------------------------------------------------------------------------------


def _status(pid: int) -> dict[str, int]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {name: int(fields[name].split()[0]) for name in ("VmRSS", "VmHWM", "Threads")}


def _dial(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _send_and_hold(address: str, data: bytes, junk: int = 0) -> socket.socket:
    """Connect, send ``data`` and ``junk`` bytes of zeros (until the other end closes), and keep the connection."""
    connection = _dial(address)
    try:
        connection.sendall(data)
        for _ in range(junk >> 20):
            connection.sendall(bytes(1 << 20))
    except OSError:  # refused: closed by the other end
        pass
    return connection


def _key(secret: bytes, sender: int, receiver: int, challenge: bytes, answer: bytes) -> bytes:
    return hmac.digest(secret, b"jaxstow-peers" + struct.pack("!II", sender, receiver) + challenge + answer, "sha256")


def _prove(address: str, secret: bytes, sender: int, receiver: int) -> tuple[socket.socket, bytes]:
    """A connection proved with the run's secret (as a process gone wrong would hold), and its key."""
    for _ in range(50):
        connection = _dial(address)
        magic, challenge = CHALLENGE.unpack(connection.recv(CHALLENGE.size, socket.MSG_WAITALL))
        answer = secrets.token_bytes(16)
        key = _key(secret, sender, receiver, challenge, answer)
        connection.sendall(HELLO.pack(magic, sender, receiver, answer, hmac.digest(key, b"hello", "sha256")))
        if connection.recv(32, socket.MSG_WAITALL) == hmac.digest(key, b"welcome", "sha256"):
            return connection, key
        connection.close()  # too many connections of that process at once: again
        time.sleep(0.1)
    raise AssertionError("the connection was never proved")


def _frame(key: bytes, number: int, tag: str, length: int) -> bytes:
    header = FRAME.pack(number, 0, len(tag), length) + tag.encode()
    return header + hmac.digest(key, b"H" + header, "sha256")


def _listening_on(pid: int, port: int) -> list[str]:
    """The local addresses (hex, as /proc shows them) of the sockets listening on ``port``."""
    lines = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    fields = [line.split() for line in lines]
    return [local.split(":")[0] for _, local, _, state, *_ in fields if state == "0A" and int(local[-4:], 16) == port]


def test_strangers_on_the_network_change_nothing_and_allocate_nothing(tmp_path):
    processes = _start("hostile", 2, tmp_path, "--timeout", "60")
    held: list[socket.socket] = []
    try:
        first = sorted((_line(process) for process in processes), key=lambda line: line["process"])
        assert _line(processes[0])["ready"]
        pid, address, secret = first[0]["pid"], first[0]["address"], bytes.fromhex(first[0]["secret"])
        host, _, port = address.rpartition(":")
        assert host == "127.0.0.1" and _listening_on(pid, int(port)) == ["0100007F"]  # not every interface
        before = _status(pid)
        strangers = 20 + 3 + 20 + 100  # the connections made below, before process 1 connects
        for _ in range(20):  # random bytes
            _send_and_hold(address, os.urandom(64 << 10)).close()
        # The previous wire format, right tags and no key: a 1 GiB tag, then a 1 TiB payload, each followed by 64 MiB.
        held.append(_send_and_hold(address, OLD_HEADER.pack(b"JXP1", 1, 1 << 30, 0, b"0" * 16), junk=64 << 20))
        tag = b"copy/1/params.p1.safetensors"
        held.append(_send_and_hold(address, OLD_HEADER.pack(b"JXP1", 1, len(tag), TIB, b"0" * 16) + tag, 64 << 20))
        # A hello claiming process 1 without the secret, then a frame of 1 TiB under a tag process 0 expects.
        claim = HELLO.pack(b"JXP2", 1, 0, os.urandom(16), os.urandom(32))
        held.append(_send_and_hold(address, claim + _frame(os.urandom(32), 0, "late", TIB), junk=64 << 20))
        for cut in range(20):  # connect and drop, claiming process 1 (cut short) or saying nothing
            _send_and_hold(address, claim[: cut * 3]).close()
        flood = [_dial(address) for _ in range(100)]  # idle connections, held open
        time.sleep(1)
        flooded = _status(pid)
        for connection in flood:
            connection.close()
        time.sleep(1)
        after = _status(pid)
        (tmp_path / "count").write_text(str(strangers))
        (tmp_path / "count").rename(tmp_path / "connect")  # process 1 connects: proved, nothing above counted as it
        assert _line(processes[1]) == {"sent": "first"}
        # With the run's secret (a process gone wrong): 1 TiB where 1000 bytes are expected, then a damaged payload.
        for tag, length, payload in (("big", TIB, bytes(1 << 20)), ("damaged", 10, bytes(10 + 32))):
            proved, key = _prove(address, secret, 1, 0)
            held.append(proved)
            with contextlib.suppress(OSError):  # refused: closed by the other end
                proved.sendall(_frame(key, 0, tag, length) + payload)
        (tmp_path / "go").touch()  # process 1 sends the message process 0 waits for
        reports = [_report(process) for process in processes]
    finally:
        for connection in held:
            connection.close()
        _killed(processes)
    report = reports[0]
    assert report["first"] == "ok" and report["late"] is True  # the real messages came through, whole
    assert report["secret stored"] is False  # deleted from jax's key-value store once every process read it
    assert "1099511627776 bytes came, at most 1000 expected" in report["big"]["error"]
    assert "damaged" in report["damaged"]["error"]
    assert report["refused"] >= strangers, report  # every one of the strangers' connections
    assert after["VmRSS"] - before["VmRSS"] < 16 << 10, (before, after)  # kB
    assert after["VmHWM"] - before["VmHWM"] < 16 << 10, (before, after)
    assert flooded["Threads"] - before["Threads"] <= 30, (before, flooded)  # 16 proving themselves, at most
