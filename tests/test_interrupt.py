"""engine/processes/interrupt.py on its own: held signals, signals caught before it was installed, and
interruptions that reach a command wrapped in another error. Each install runs in a child process
(it changes the process's signal handling)."""

from __future__ import annotations

import signal
import subprocess
import sys

from shardsmith.engine.processes import interrupt


def _child(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_keyboard_interrupt_wrapped_in_another_error_is_an_interruption():
    """Python wraps a KeyboardInterrupt raised in ``__set_name__`` (a dataclass made while a module
    imports) in a RuntimeError: still an interruption, one line, not a traceback."""
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise RuntimeError("Error calling __set_name__") from exc
    except RuntimeError as wrapped:
        assert interrupt.is_interruption(wrapped)
    assert not interrupt.is_interruption(RuntimeError("a bug"))


def test_a_signal_held_is_raised_when_the_scope_ends():
    done = _child("import os, signal\nfrom shardsmith.engine.processes import interrupt\ninterrupt.install(); interrupt.started()\n"
                  "try:\n    with interrupt.held():\n        os.kill(os.getpid(), signal.SIGTERM)\n"
                  "        print('still here')\nexcept interrupt.Interrupted as exc:\n    print('raised', exc.signum)\n")
    assert done.stdout.split() == ["still", "here", "raised", str(int(signal.SIGTERM))], done


def test_a_signal_the_program_recorded_before_install_is_held_for_the_command():
    """``program.main`` records signals with builtins before it imports anything; ``install`` holds the
    first, and the command's start raises it (exit status of the signal, one line)."""
    done = _child("import signal\nfrom shardsmith.engine.processes import interrupt\n"
                  "interrupt.install(early=[int(signal.SIGTERM)])\nprint('start-up goes on')\n"
                  "try:\n    interrupt.started()\nexcept interrupt.Interrupted as exc:\n"
                  "    print('raised', exc.signum, interrupt.exit_code(exc))\n")
    assert done.stdout.split() == ["start-up", "goes", "on", "raised", "15", "143"], done


def test_a_signal_held_in_a_scope_that_fails_is_still_raised():
    """An extension whose init fails (an optional dependency) while a signal is held: the
    interruption is raised there, its error as context, not lost until the watcher ends the process."""
    done = _child("import os, signal\nfrom shardsmith.engine.processes import interrupt\ninterrupt.install(); interrupt.started()\n"
                  "try:\n    with interrupt.held():\n        os.kill(os.getpid(), signal.SIGINT)\n"
                  "        raise ImportError('no such extension')\nexcept KeyboardInterrupt as exc:\n"
                  "    print('interrupted', type(exc.__context__).__name__)\n")
    assert done.stdout.split() == ["interrupted", "ImportError"], done
