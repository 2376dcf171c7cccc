"""Ctrl-C (SIGINT) and SIGTERM (SLURM preemption, ``kill``): the program stops within two seconds,
keeps every finished part, and says one line.

Python runs a signal handler only between bytecodes of the main thread, so a main thread busy in a
long call into Rust or C (a tokenizer) would not hear the signal until that call returns. So the
C-level handler also writes the signal number to a pipe (``signal.set_wakeup_fd``), and a daemon
thread waiting on the pipe records it at once: code that unwinds with some other exception (a
library that turned the KeyboardInterrupt into its own error) is still known to be interrupted,
and if the main thread has not ended the process ``GRACE`` seconds later, the thread ends it
itself, as a kill would (every finished file is already renamed into place; nothing half-written
is ever trusted by a rerun).

Worker processes ignore both signals (``ignore_in_worker``): a terminal's Ctrl-C and SLURM's
SIGTERM reach every process of the job, and a worker that died of them would look like a worker
the system killed. The parent stops them (they also die with it: ``resume.die_with_parent``).

A signal is *held* (recorded, raised later) where raising it would do harm:

- during start-up, from ``install`` until the command's body begins (``started``): click turns a
  KeyboardInterrupt raised while it parses options or loads entry points into "Aborted!" and exit
  1, so a signal then is raised where the command catches it, and says the one line;
- while an extension module initializes (``held``, around every ``ExtensionFileLoader`` step): a
  KeyboardInterrupt raised in the Python code an extension's init calls (its own imports) can
  leave the extension half made, and some crash on it (orjson: SIGSEGV).

Only the ``shardsmith`` program installs this (``install``); ``import shardsmith`` in a user's
process changes no signal handling.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

GRACE = 1.5  # seconds the main thread has to unwind before the process is ended for it
MESSAGE = "interrupted: run the same command again to resume"
_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_received: int | None = None
_installed = False
_holding = 0  # held() scopes the main thread is in (start-up counts as one)
_starting = False  # start-up's hold is in force (until ``started``)
_pending: int | None = None  # a signal that arrived while held
_handled: int | None = None  # the first signal the main thread's handler saw (at once, unlike the watcher)


class Interrupted(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt: every ``except
    KeyboardInterrupt`` that keeps finished work keeps it for both."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def received() -> int | None:
    """The signal that interrupted this process (SIGINT or SIGTERM), or None: as the watcher thread
    recorded it, or as the main thread's handler did (whichever ran first)."""
    return _received or _handled


def is_interruption(exc: BaseException | None) -> bool:
    """Whether ``exc`` is (or came from) an interruption: a KeyboardInterrupt (also as the cause of
    another error: Python wraps one raised in ``__set_name__`` in a RuntimeError), or any error
    raised while the process was being interrupted."""
    seen = exc
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return received() is not None


def exit_code(exc: BaseException | None = None) -> int:
    """128 + the signal number, as shells report a process killed by it: 130 for SIGINT, 143 for SIGTERM."""
    signum = received() or (exc.signum if isinstance(exc, Interrupted) else signal.SIGINT)
    return 128 + int(signum)


def line_start() -> str:
    """A newline first on a terminal, where a progress bar may hold the line; nothing in a log."""
    try:
        return "\n" if os.isatty(2) else ""
    except OSError:
        return ""


def _raise(signum: int) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Interrupted(signum)


def _on_signal(signum: int, frame: object) -> None:
    """The Python-level handler of both signals (main thread, between bytecodes): raise, or hold."""
    global _pending, _handled
    _handled = _handled or signum
    if _holding:
        _pending = _pending or signum
        return
    _raise(signum)


def _release() -> None:
    global _pending
    if not _holding and _pending is not None:
        signum, _pending = _pending, None
        _raise(signum)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM in the main thread for the scope's duration; one that arrived is raised
    when it ends (the watcher thread still ends the process ``GRACE`` seconds after it, as always)."""
    global _holding
    if not _installed or threading.current_thread() is not threading.main_thread():
        yield
        return
    _holding += 1
    try:
        yield
    finally:  # also when the scope failed: the interruption then stands in for its error (as context)
        _holding -= 1
        _release()


def started() -> None:
    """The command's body begins: start-up's hold ends, and a signal it held is raised here."""
    global _starting, _holding
    if _starting:
        _starting = False
        _holding -= 1
        _release()


def _hold_extension_imports() -> None:
    """Extension modules initialize inside ``held`` (see the module's docstring)."""
    from importlib.machinery import ExtensionFileLoader

    create, execute = ExtensionFileLoader.create_module, ExtensionFileLoader.exec_module

    def create_module(self: ExtensionFileLoader, spec: Any) -> Any:
        with held():
            return create(self, spec)

    def exec_module(self: ExtensionFileLoader, module: Any) -> None:
        with held():
            execute(self, module)

    ExtensionFileLoader.create_module = create_module  # type: ignore[method-assign]
    ExtensionFileLoader.exec_module = exec_module  # type: ignore[method-assign]


def _say_and_exit(signum: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    with contextlib.suppress(OSError):
        os.write(2, f"{line_start()}shardsmith: {MESSAGE}\n".encode())
    os._exit(128 + signum)


def _watch(read_fd: int) -> None:
    global _received
    while True:
        try:
            data = os.read(read_fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        signum = data[-1]
        if signum not in _SIGNALS:
            continue
        if _received is None:
            _received = signum
            timer = threading.Timer(GRACE, _say_and_exit, args=(signum,))
            timer.daemon = True
            timer.start()
        else:  # a second Ctrl-C: the user does not want to wait
            _say_and_exit(signum)


def install(*, early: list[int] | None = None) -> None:
    """Route SIGINT and SIGTERM as described above (the main thread of the program, once). ``early``:
    signals a recorder caught before (``program.main``), held as if they came now."""
    global _installed, _starting, _holding, _pending, _handled
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    _installed = True
    _starting, _holding = True, _holding + 1  # start-up: held until ``started``
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    if early:  # (read after the handlers changed: a signal between the two is in one or the other)
        _pending = _handled = early[0]
    _hold_extension_imports()
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    # a process forked from here (a worker) ignores both from its first instruction on: a Ctrl-C to
    # the whole process group that lands while a worker starts (before its initializer runs) would
    # otherwise end that worker with a traceback of its own
    os.register_at_fork(after_in_child=ignore_in_worker)
    threading.Thread(target=_watch, args=(read_fd,), name="shardsmith-signals", daemon=True).start()
    if early:  # the watcher hears of it too (its grace period starts now)
        with contextlib.suppress(OSError):
            os.write(write_fd, bytes([early[0]]))


def ignore_in_worker() -> None:
    """In a worker process: ignore SIGINT and SIGTERM (the parent stops its workers), and do not
    report signals through the parent's pipe. A signal the parent held while it forked is the
    parent's to raise, not the child's (a child forked inside ``held`` leaves it too)."""
    global _pending
    _pending = None
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(ValueError):  # not the worker's main thread: nothing was inherited there
        signal.set_wakeup_fd(-1)


def end_with_parent() -> None:
    """In a forked child (Linux): be killed when the parent dies, so a run that is killed or
    interrupted leaves no child behind (its workers, the listing of a big folder)."""
    import ctypes

    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            return
        if os.getppid() == 1:  # the parent died before prctl took effect
            os._exit(1)
