"""The processes of a ``jax.distributed`` run agreeing through jax's key-value store and barriers, every wait bounded.

A :class:`Coordinator` is one process's part in a scope (a checkpoint folder, say); each agreement is a
:class:`Conversation` of it, named the same in every process because every process starts the same conversations in
the same order: what a process does next is itself agreed (a decision made once and published, or a maximum), never
taken from that process's own listing. A message is JSON, either a payload or an error naming the process that
failed; a wait for one ends within the timeout or raises a :class:`~jaxstow.errors.CheckpointError` naming every
process that did not send it. A conversation's keys are deleted once every process has closed it (a ``with`` block
closes it, after an error too). In one process, the same calls run without a key-value store.

>>> from jaxstow._coordination import Coordinator
>>> coordinator = Coordinator("runs/a", timeout=60)
>>> with coordinator.conversation("save") as talk:
...     talk.gather("summary", {"files": 2}, waiting_for="its files")
...     talk.decide("step", lambda: 7, waiting_for="the step to save")
...     talk.agree_max("newest", 5)
[{'files': 2}]
7
5
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import itertools
import json
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, NoReturn, TypeVar

import jax

from jaxstow import errors
from jaxstow._util import jax_compat
from jaxstow._util.signal_free import start_thread
from jaxstow.errors import ArgumentError, CheckpointError, JaxstowError

__all__ = ["Conversation", "Coordinator", "Message"]

# The conversations started so far in each scope and kind, by this process: the n-th has the same name everywhere.
_started: dict[str, itertools.count[int]] = {}
_started_lock = threading.Lock()
# Process 0: the conversations of every scope whose keys go once every process has closed them.
_closing: list[str] = []
#: The most conversations given up on by other processes that one start passes over.
MAX_SKIPPED = 1000
#: How often, in seconds, a process waiting for another's message checks whether the conversation was given up on.
POLL = 0.5
#: The longest wait, in seconds, jax.distributed's key-value store takes (its milliseconds are a 32-bit integer).
MAX_TIMEOUT = (2**31 - 1) // 1000


class Coordinator:
    """This process's index among ``count`` processes, and the conversations they have within ``scope``."""

    def __init__(self, scope: str, *, timeout: float) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= MAX_TIMEOUT:
            raise ArgumentError(
                f"process_timeout must be a positive number of seconds, at most {MAX_TIMEOUT} (about 24 days: the "
                f"longest wait jax.distributed's key-value store takes), not {timeout!r}"
            )
        self.index = int(jax.process_index())
        self.count = int(jax.process_count())
        self.timeout = float(timeout)
        self.scope = scope
        self.prefix = "jaxstow/" + hashlib.sha256(scope.encode()).hexdigest()[:16]
        self.client: Any = None
        if self.count > 1:
            self.client = jax_compat.distributed_client()
            if self.client is None:
                raise CheckpointError(
                    f"jax sees {self.count} processes but no jax.distributed client: call jax.distributed.initialize()"
                )

    @property
    def many(self) -> bool:
        """Whether other processes take part."""
        return self.count > 1

    @property
    def others(self) -> list[int]:
        """The indices of the other processes."""
        return [index for index in range(self.count) if index != self.index]

    @property
    def grace(self) -> float:
        """How much longer than ``timeout`` a process waits for a decision of process 0's, so that process 0's own
        verdict (which names the process it waited for) arrives first: 5 s or a tenth of the timeout."""
        return max(5.0, self.timeout / 10)

    def conversation(self, kind: str) -> Conversation:
        """The next conversation of ``kind`` in this scope, named the same in every process: past those that other
        processes gave up on before this one came (a call that ran alone in them, or that this process came to too
        late), each closed here so that its keys go, so that this process's call pairs with their next."""
        with _started_lock:
            numbers = _started.setdefault(f"{self.prefix}/{kind}", itertools.count(1))
        for _ in range(MAX_SKIPPED):
            with _started_lock:
                talk = Conversation(self, f"{self.prefix}/{kind}{next(numbers)}")
            if not talk.given_up():
                break
            talk.close()
        return talk


@dataclasses.dataclass(frozen=True)
class Message:
    """What one process said: a payload, or the error it met (``error`` set)."""

    sender: int
    payload: Any = None
    error: str | None = None

    def value(self) -> Any:
        """The payload, or the sender's error (see :func:`failure`)."""
        if self.error is not None:
            raise failure([self])
        return self.payload


class Conversation:
    """One agreement among the processes: messages under names (``what``), barriers, decisions, a maximum."""

    def __init__(self, coordinator: Coordinator, name: str) -> None:
        self.coordinator = coordinator
        self.name = name
        self._own: dict[str, str] = {}  # one process: what it said, heard by itself

    def __enter__(self) -> Conversation:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()  # after an error too: this process reads nothing more of it

    def tell(self, what: str, payload: Any) -> None:
        """Say ``payload`` (JSON) under ``what`` to the other processes."""
        self._say(what, {"ok": payload})

    def fail(self, what: str, error: BaseException | str) -> None:
        """Say, under ``what``, that this process failed with ``error`` instead of a payload."""
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        self._say(what, {"error": text})

    def hear(self, what: str, sender: int, *, waiting_for: str, timeout: float | None = None) -> Any:
        """What ``sender`` said under ``what``; raises if it failed, or said nothing within ``timeout``."""
        return self.collect(what, [sender], waiting_for=waiting_for, timeout=timeout)[sender].value()

    def collect(
        self, what: str, senders: list[int] | None = None, *, waiting_for: str, timeout: float | None = None
    ) -> dict[int, Message]:
        """The message each of ``senders`` (every process by default) said under ``what``, all within one deadline;
        raises naming every process that said nothing by then."""
        coordinator = self.coordinator
        senders = list(range(coordinator.count)) if senders is None else senders
        limit = coordinator.timeout if timeout is None else timeout
        if not coordinator.many:
            return {sender: _message(sender, self._own[f"{what}/{sender}"]) for sender in senders}
        deadline = time.monotonic() + limit
        got: dict[int, Message] = {}
        for sender in senders:
            try:
                text = self._wait(f"{what}/{sender}", deadline)
            except CheckpointError:
                raise
            except Exception as error:  # jax raises its runtime's own error types here
                said = self._said(what, timeout=coordinator.grace)
                missing = [other for other in senders if other not in got and other not in said]
                self._give_up(_missing(missing or [sender], waiting_for, limit, error))
            got[sender] = _message(sender, text)
        return got

    def given_up(self) -> dict[int, str]:
        """Why each process that gave up on this conversation (its wait ran out) did, by process."""
        if not self.coordinator.many:
            return {}
        try:
            found = _within(
                self.coordinator.grace, lambda: self.coordinator.client.key_value_dir_get(self._key("over/"))
            )
        except Exception:  # jax raises its runtime's own error types here; unread, it counts as not given up on
            return {}
        return {int(key.rsplit("/", 1)[-1]): str(why) for key, why in found}

    def _wait(self, key: str, deadline: float) -> str:
        """The message under ``key``, waited for until ``deadline``, or until another process gave up on this
        conversation: a :class:`CheckpointError` saying which and why, at once rather than at the deadline."""
        while True:
            left = deadline - time.monotonic()
            try:
                return str(
                    self.coordinator.client.blocking_key_value_get(self._key(key), max(0, int(min(left, POLL) * 1000)))
                )
            except Exception:
                if left <= POLL:
                    raise
            over = {index: why for index, why in self.given_up().items() if index != self.coordinator.index}
            if over:
                raise CheckpointError(
                    "; ".join(f"process {index} gave up on this call: {why}" for index, why in sorted(over.items()))
                    + "; this process's call failed with it, and the next calls of every process pair up again"
                )

    def _give_up(self, why: str) -> NoReturn:
        """Raise ``why``, marking the conversation given up on: a process that comes to it later passes over it."""
        with contextlib.suppress(Exception):  # a store that cannot be reached: the others time out as this one did
            key, client = self._key(f"over/{self.coordinator.index}"), self.coordinator.client
            _within(self.coordinator.grace, lambda: client.key_value_set(key, why))
        raise CheckpointError(why) from None

    def gather(self, what: str, payload: Any, *, waiting_for: str) -> list[Any]:
        """Say ``payload`` and hear every process's, in process order; raises naming every process that failed."""
        self.tell(what, payload)
        messages = self.collect(what, waiting_for=waiting_for)
        failed = [message for message in messages.values() if message.error is not None]
        if failed:
            raise failure(failed)
        return [messages[index].payload for index in range(self.coordinator.count)]

    def decide(self, what: str, choose: Callable[[], Any], *, waiting_for: str) -> Any:
        """``choose()`` in process 0, its result (or its error) in every process: a decision made once."""
        coordinator = self.coordinator
        if coordinator.index == 0:
            try:
                decision = choose()
            except BaseException as error:
                self.fail(what, error)
                raise
            self.tell(what, decision)
            return decision
        return self.hear(what, 0, waiting_for=waiting_for, timeout=coordinator.timeout + coordinator.grace)

    def agree_max(self, what: str, value: int) -> int:
        """The largest of every process's ``value``."""
        return int(max(self.gather(what, value, waiting_for=f"its {what}")))

    def barrier(self, what: str, *, waiting_for: str) -> None:
        """Wait until every process reaches this barrier: process 0 waits for every one (the timeout) and says go,
        or names those that did not come; the others wait for its word. On key-value messages, not jax's own
        barrier: one of jax's that times out is an error of the run, for which jax may end every process before it
        can raise (seen with jax 0.10.2)."""
        self.tell(f"{what}/arrived", True)

        def every_process() -> bool:
            self.collect(f"{what}/arrived", waiting_for=waiting_for)
            return True

        self.decide(f"{what}/go", every_process, waiting_for=waiting_for)

    def close(self) -> None:
        """This process is done with the conversation. Process 0 deletes the keys of each conversation every
        process has closed (this one, or one closed before it, in any scope)."""
        coordinator = self.coordinator
        if not coordinator.many:
            self._own.clear()
            return
        try:
            self._say("closed", {"ok": True})
            if coordinator.index != 0:
                return
            with _started_lock:
                _closing.append(self.name)
                pending = list(_closing)
            for name in pending:
                if len(_listed(coordinator.client, f"{name}/closed", coordinator.grace)) == coordinator.count:
                    _within(coordinator.grace, functools.partial(coordinator.client.key_value_delete, name))
                    with _started_lock:
                        if name in _closing:
                            _closing.remove(name)
        except Exception:  # a store that lost a process keeps the keys: nothing will read them again
            return

    def _say(self, what: str, message: dict[str, Any]) -> None:
        key = f"{what}/{self.coordinator.index}"
        text = json.dumps(message)
        if self.coordinator.many:  # the store is process 0's: bounded, should it be stopped (SIGSTOP)
            client, limit = self.coordinator.client, self.coordinator.timeout
            try:
                _within(limit, lambda: client.key_value_set(self._key(key), text))
            except TimeoutError:
                raise CheckpointError(
                    f"the coordination service (process 0's) did not take this process's {what} within {limit:g} s: "
                    "process 0 is stalled or stopped"
                ) from None
        else:
            self._own[key] = text

    def _key(self, what: str) -> str:
        return f"{self.name}/{what}"

    def _said(self, what: str, *, timeout: float) -> set[int]:
        """The processes that said something under ``what``."""
        listed = _listed(self.coordinator.client, self._key(what), timeout)
        return {int(sender) for sender in listed if sender.isdigit()}


def _listed(client: Any, directory: str, timeout: float) -> list[str]:
    """The names of the keys in ``directory`` of the key-value store (none where it cannot be read in time)."""
    try:
        return [
            key.rsplit("/", 1)[-1] for key, _ in _within(timeout, lambda: client.key_value_dir_get(directory + "/"))
        ]
    except Exception:  # jax raises its runtime's own error types here
        return []


Answer = TypeVar("Answer")


def _within(seconds: float, call: Callable[[], Answer]) -> Answer:
    """``call()`` (a call to the key-value store, which has no deadline of its own) waited for ``seconds`` at most, in
    a thread of its own: a :class:`TimeoutError` past them, as when the process serving the store is stopped."""
    answer: list[Answer] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            answer.append(call())
        except BaseException as error:
            failed.append(error)

    thread = threading.Thread(target=run, name="jaxstow-coordination", daemon=True)
    start_thread(thread)
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {seconds:g} s")
    if failed:
        raise failed[0]
    return answer[0]


def failure(failed: list[Message]) -> JaxstowError:
    """The error of processes that failed, naming each: of the class of their errors where jaxstow's errors of one
    class that takes a message (a :class:`~jaxstow.errors.StepNotFoundError` in every process, as in one), else a
    :class:`CheckpointError`.

    >>> failure([Message(0, error="StepNotFoundError: runs/a holds no committed step to restore")])
    StepNotFoundError('process 0 failed: StepNotFoundError: runs/a holds no committed step to restore')
    """
    message = "; ".join(f"process {m.sender} failed: {m.error}" for m in failed)
    names = {(m.error or "").partition(":")[0] for m in failed}
    kind = getattr(errors, names.pop(), None) if len(names) == 1 else None
    taking_a_message = (JaxstowError.__init__, errors.FormatError.__init__, errors.RequestError.__init__)
    if isinstance(kind, type) and issubclass(kind, JaxstowError) and kind.__init__ in taking_a_message:
        return kind(message)
    return CheckpointError(message)


def _message(sender: int, text: str) -> Message:
    decoded = json.loads(text)
    if "error" in decoded:
        return Message(sender, error=str(decoded["error"]))
    return Message(sender, payload=decoded["ok"])


def _missing(processes: list[int], what: str, timeout: float, error: BaseException) -> str:
    names = ", ".join(str(index) for index in processes)
    plural = "es" if len(processes) > 1 else ""
    detail = str(error).splitlines()[0] if str(error) else type(error).__name__
    return (
        f"process{plural} {names} did not report {what} within {timeout:g} s (stalled, failed or died; "
        f"jax.distributed: {detail})"
    )
