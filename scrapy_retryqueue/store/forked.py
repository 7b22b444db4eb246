"""The store writer service in a process forked from the crawl, and the crawl's handle on it.

Why a process: a writer thread in the crawl's process pays for the GIL it shares
with the reactor (the same batch of events costs it two to four times the CPU
it costs in a process alone: docs/benchmarks.md, deadletters), and SQLAlchemy's
modules on the crawl's heap lengthen every full garbage collection of the crawl. A process forked while the crawl is still
single-threaded (as its extensions are built) starts from the crawl's own
imports and settings, so it costs no start-up of its own until it has work.

The child makes its service only when the crawl asks (:meth:`ForkedWriter.run`),
with the factory it was forked with; until then it waits on a pipe. Requests
and answers are JSON lines on two pipes: the crawl sends ``run``, ``stop``,
``force``, ``flush``, ``unwritten`` and ``close``; the child sends its counters'
increments, its log records (re-emitted by the crawl's loggers, so LOG_LEVEL,
LOG_FILE and the log_count stats treat them as the crawl's own) and its answers.

The child ignores SIGINT and SIGTERM (Ctrl-C reaches the whole process group:
the crawl decides when its writer stops) and ends when the crawl's end of the
pipe closes, whatever killed the crawl: what it had not written waits in Redis.
It leaves by ``os._exit``: nothing of the crawl it was copied from (atexit
handlers, buffered files, the reactor) runs twice.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import logging
import os
import signal
import threading
import traceback
import weakref
from collections.abc import Callable
from typing import Any

from .. import heap

logger = logging.getLogger(__name__)

#: make_service(spider, forward) → an object with run, stop, force, flush,
#: unwritten and close (:class:`~.service.WriterService`); forward(name, value)
#: counts an increment of one of its stats.
ServiceFactory = Callable[[str, Callable[[str, int], Any]], Any]

#: Signals the child ignores: the crawl's to act on (its Ctrl-C, Scrapyd's cancel).
_IGNORED = (signal.SIGINT, signal.SIGTERM)

#: Longest the crawl waits for the child to end after ``close``, seconds.
EXIT_TIMEOUT = 10.0


#: The writers this process forked and has not reaped yet.
_LIVE: weakref.WeakSet[ForkedWriter] = weakref.WeakSet()


class WriterGone(RuntimeError):
    """The writer process ended (or its pipe broke) before it answered."""


def can_fork() -> str | None:
    """Why this process cannot fork its writer now, or None when it can."""
    if not hasattr(os, "fork"):
        return "this platform has no fork()"
    if threading.active_count() > 1:
        # A fork copies only the forking thread: a lock another thread holds
        # would stay held in the child for ever.
        return "other threads are running in the crawl's process"
    return None


class ForkedWriter:
    """The crawl's side: what the glue calls on a writer service, carried out by a
    forked child. Made by :meth:`fork`; thread-safe."""

    def __init__(self, pid: int, to_child: int, from_child: int) -> None:
        self.pid = pid
        self._out = os.fdopen(to_child, "wb", buffering=0)
        self._in = os.fdopen(from_child, "rb")
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._answers: dict[int, Any] = {}
        self._answered = threading.Condition()
        self._ran = threading.Event()
        self._gone = threading.Event()
        self._reader: threading.Thread | None = None
        self._forward: Callable[[str, int], Any] | None = None
        #: The spider whose events it writes (set by :meth:`start`).
        self.spider: str | None = None
        #: Its exit status once reaped (negative: the signal that killed it).
        self.exit_status: int | None = None
        #: The child's own CPU seconds (user + system), once it has ended.
        self.cpu_seconds: float | None = None
        #: Releases the heap freeze taken for the fork (heap.py), once the child is reaped.
        self._release_heap: Callable[[], None] | None = None

    @classmethod
    def fork(cls, make_service: ServiceFactory, *, freeze_heap: bool = False) -> ForkedWriter:
        """Fork the writer process; it waits for :meth:`run`. Raises OSError when
        the system refuses the process (call :func:`can_fork` first).

        *freeze_heap*: freeze this process's heap first, until the writer ends
        (heap.py): the crawl's collector then never writes to the pages the two
        processes share, so they stay shared.
        """
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        # Held back across the fork: a Ctrl-C in that instant must not kill the
        # child before it ignores it (the parent gets its own once unblocked).
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _IGNORED)
        release_heap: Callable[[], None] | None = None
        try:
            if freeze_heap:
                release_heap = heap.hold()
            pid = os.fork()
        except BaseException:
            if release_heap is not None:
                release_heap()
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            for fd in (to_child_r, to_child_w, from_child_r, from_child_w):
                os.close(fd)
            raise
        if pid == 0:  # pragma: no cover - the child's coverage is not collected
            status = 1
            try:
                for signum in _IGNORED:
                    signal.signal(signum, signal.SIG_IGN)
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
                os.close(to_child_w)
                os.close(from_child_r)
                # Another writer's pipe ends, copied in: held open here, that
                # writer would never see its crawl's end of the pipe close.
                for other in list(_LIVE):
                    other._drop_in_child()
                status = _Child(to_child_r, from_child_w, make_service).serve()
            finally:
                os._exit(status)
        try:
            os.close(to_child_r)
            os.close(from_child_w)
            writer = cls(pid, to_child_w, from_child_r)
            writer._release_heap = release_heap
            _LIVE.add(writer)
        except BaseException:
            if release_heap is not None:
                release_heap()
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        return writer

    def _drop_in_child(self) -> None:
        # Pointed at /dev/null, not closed: a file object finalized later closes
        # its number, which by then could be one of the child's own sockets.
        null = os.open(os.devnull, os.O_RDWR)
        try:
            for pipe in (self._out, self._in):
                with contextlib.suppress(OSError, ValueError):
                    os.dup2(null, pipe.fileno())
        finally:
            os.close(null)

    # -- what the glue calls ------------------------------------------------------------

    def start(self, spider: str, forward: Callable[[str, int], Any]) -> None:
        """Serve *spider*; begin reading the child's lines, *forward*(name, value)
        getting its counts."""
        if self._reader is None:
            self.spider = spider
            self._forward = forward
            self._reader = threading.Thread(
                target=self._read, name="retryqueue-store-pipe", daemon=True
            )
            self._reader.start()

    def run(self) -> None:
        """Make the service in the child and write the spider's events until
        :meth:`stop`; raises :class:`WriterGone` if the child ends first."""
        self._send({"op": "run", "spider": self.spider})
        while not self._ran.wait(0.5):
            if self._gone.is_set():
                raise WriterGone(self._gone_reason())

    def stop(self) -> None:
        self._send({"op": "stop"}, quiet=True)

    def force(self) -> None:
        self._send({"op": "force"}, quiet=True)

    def flush(self, deadline: float, *, closing: bool = True) -> int:
        """Write what is left until *deadline*: the service's
        :meth:`~.service.WriterService.flush`, made first if it never ran."""
        # time.monotonic() is the system's monotonic clock: one deadline for both processes.
        return int(self._ask("flush", spider=self.spider, deadline=deadline, closing=closing))

    def unwritten(self) -> dict[str, int | None]:
        return dict(self._ask("unwritten"))

    def close(self) -> None:
        """Close the service and end the child; returns once it has ended."""
        try:
            with contextlib.suppress(WriterGone):
                self._ask("close")
        finally:
            self.end()

    def end(self, timeout: float = EXIT_TIMEOUT) -> None:
        """Close the pipe (the child ends) and reap it; killed after *timeout*.

        Blocking (the glue calls it off the reactor): the end of the child's
        answers, read by the reader thread, says it has gone.
        """
        try:
            self._end(timeout)
        finally:
            # Whatever ended it: the heap must not stay frozen for a writer gone.
            if self._release_heap is not None:
                self._release_heap()

    def _end(self, timeout: float) -> None:
        with contextlib.suppress(OSError):
            self._out.close()
        if self.exit_status is not None:
            return
        if self._reader is None:  # it never served: read its pipe only for its end
            self.start(self.spider or "", lambda name, value: None)
        assert self._reader is not None
        self._reader.join(timeout)
        if self._reader.is_alive():
            # Its end of the pipe still open after the timeout: a child stuck (or a
            # process the crawl forked later holding a copy of that end).
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        try:
            _, status, usage = os.wait4(self.pid, 0)
        except ChildProcessError:
            pass
        else:
            self.exit_status = os.waitstatus_to_exitcode(status)
            self.cpu_seconds = usage.ru_utime + usage.ru_stime
        self._reader.join(timeout)
        with contextlib.suppress(OSError):
            self._in.close()
        _LIVE.discard(self)

    # -- the pipes ----------------------------------------------------------------------

    def _send(self, message: dict[str, Any], *, quiet: bool = False) -> None:
        line = json.dumps(message).encode() + b"\n"
        try:
            with self._send_lock:
                self._out.write(line)
        except (OSError, ValueError):  # a broken pipe, or closed already
            if not quiet:
                raise WriterGone(self._gone_reason()) from None

    def _ask(self, op: str, **fields: Any) -> Any:
        ident = next(self._ids)
        # Sent outside the condition: the reader takes it to file every answer.
        self._send({"op": op, "id": ident, **fields})
        with self._answered:
            while ident not in self._answers:
                if self._gone.is_set():
                    raise WriterGone(self._gone_reason())
                self._answered.wait(0.5)
            ok, value = self._answers.pop(ident)
        if not ok:
            raise RuntimeError(f"the store writer process failed: {value}")
        return value

    def _read(self) -> None:
        try:
            for line in self._in:
                try:
                    message = json.loads(line)
                except ValueError:
                    message = None
                if isinstance(message, dict):
                    self._dispatch(message)
        except (OSError, ValueError):
            pass
        finally:
            self._gone.set()
            with self._answered:
                self._answered.notify_all()

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "inc" in message:
            name, value = message["inc"]
            if self._forward is not None:
                self._forward(name, value)
        elif "log" in message:
            _emit(message["log"])
        elif "ran" in message:
            self._ran.set()
        elif "id" in message:
            with self._answered:
                self._answers[message["id"]] = (message.get("ok", False), message.get("value"))
                self._answered.notify_all()

    def _gone_reason(self) -> str:
        return f"the store writer process (pid {self.pid}) ended"


def _emit(fields: dict[str, Any]) -> None:
    """A record of the child's, handled by the crawl's logger of the same name."""
    name = str(fields.get("name", __name__))
    level = int(fields.get("level", logging.INFO))
    target = logging.getLogger(name)
    if not target.isEnabledFor(level):
        return
    record = target.makeRecord(
        name, level, "(store writer process)", 0, fields.get("msg", ""), None, None
    )
    record.exc_text = fields.get("exc") or None
    target.handle(record)


class _PipeHandler(logging.Handler):
    """The child's one log handler: each record, formatted, to the crawl."""

    def __init__(self, send: Callable[[dict[str, Any]], None]) -> None:
        super().__init__()
        self._send = send
        self._formatter = logging.Formatter()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            exc = record.exc_text
            if record.exc_info and not exc:
                exc = self._formatter.formatException(record.exc_info)
            self._send(
                {
                    "log": {
                        "name": record.name,
                        "level": record.levelno,
                        "msg": record.getMessage(),
                        "exc": exc,
                    }
                }
            )
        except Exception:  # pragma: no cover - logging must never raise
            self.handleError(record)


class _Child:
    """The forked side: one service, commands from the crawl, answers back."""

    def __init__(self, commands: int, answers: int, make_service: ServiceFactory) -> None:
        self._commands = commands
        self._answers = answers
        self._make_service = make_service
        #: One line at a time on the answers pipe.
        self._send_lock = threading.Lock()
        #: The service is made once; a stop or force may come before it is.
        self._lock = threading.Lock()
        self._service: Any = None
        self._stopped = False
        self._forced = False
        self._runner: threading.Thread | None = None
        self._ops: list[threading.Thread] = []

    def serve(self) -> int:
        # The crawl's objects, copied in, live as long as this process: the
        # collector need not walk them (nor copy their pages by touching them).
        gc.freeze()
        root = logging.getLogger()
        for handler in list(root.handlers):
            root.removeHandler(handler)
        root.addHandler(_PipeHandler(self._send))
        with os.fdopen(self._commands, "rb") as commands:
            for line in commands:
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                try:
                    if isinstance(message, dict) and self._handle(message):
                        break
                except Exception:
                    # The service cannot be made here: the crawl sees the process
                    # end and writes from its own thread instead.
                    logger.exception("scrapy-retryqueue: the store writer process failed")
                    return 1
        # The crawl is gone (or asked us to close): end every wait, keep nothing.
        self._halt(force=True)
        if self._runner is not None:
            self._runner.join(EXIT_TIMEOUT)
        for op in self._ops:
            op.join(EXIT_TIMEOUT)
        return 0

    def _send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message).encode() + b"\n"
        with self._send_lock, contextlib.suppress(OSError):  # the crawl is gone: no one to tell
            view = memoryview(data)
            while view:
                view = view[os.write(self._answers, view) :]

    def _inc(self, name: str, value: int) -> None:
        self._send({"inc": [name, value]})

    def _handle(self, message: dict[str, Any]) -> bool:
        """Carry out one command; True when it was the last."""
        op = message.get("op")
        if op == "run" and self._runner is None:
            self._ensure(str(message["spider"]))
            self._runner = threading.Thread(target=self._run, name="retryqueue-store")
            self._runner.start()
        elif op in ("stop", "force"):
            self._halt(force=op == "force")
        elif op in ("flush", "unwritten", "close"):
            # Off this thread: a flush that waits for the database must not keep
            # a ``force`` from being read.
            thread = threading.Thread(target=self._answer, args=(message,))
            self._ops.append(thread)
            thread.start()
            if op == "close":
                thread.join()
                return True
        return False

    def _halt(self, *, force: bool) -> None:
        """Stop (or force) the service, now or as soon as it is made."""
        with self._lock:
            self._stopped = True
            self._forced |= force
            service = self._service
        if service is not None:
            service.force() if force else service.stop()

    def _ensure(self, spider: str) -> Any:
        with self._lock:
            if self._service is None:
                service = self._make_service(spider, self._inc)
                # The writer's modules (SQLAlchemy's, imported for it here) live as
                # long as this process too: a full collection walked them all
                # (about 20 ms each), several times a crawl.
                gc.freeze()
                # What the crawl asked before the service existed holds for it.
                if self._forced:
                    service.force()
                elif self._stopped:
                    service.stop()
                self._service = service
            return self._service

    def _run(self) -> None:
        try:
            self._service.run()
        except Exception:
            logger.exception("scrapy-retryqueue: the store writer failed")
        finally:
            self._send({"ran": True})

    def _answer(self, message: dict[str, Any]) -> None:
        op, ident = message["op"], message.get("id")
        try:
            service = self._service
            if op == "flush":
                service = self._ensure(str(message["spider"]))
                deadline, closing = float(message["deadline"]), bool(message["closing"])
                value: Any = service.flush(deadline, closing=closing)
            elif op == "unwritten":
                value = {} if service is None else service.unwritten()
            else:
                if service is not None:
                    service.close()
                value = None
            self._send({"id": ident, "ok": True, "value": value})
        except Exception:
            # Not logged here: the crawl raises it where the thread's would be raised.
            self._send({"id": ident, "ok": False, "value": traceback.format_exc()})
