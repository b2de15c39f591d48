"""The command line's progress and native log: one tqdm bar per phase on a terminal (plain lines, one per phase
and one every ~10 s, when stderr is not a terminal), and ONNX Runtime's and QNN's own log lines, which their C++
code writes straight to file descriptor 2, sent to the study's `mpstudio.log` so they don't break the bars."""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
from contextlib import contextmanager
from pathlib import Path

from ..errors import MpstudioError
from ..progress_lines import LineProgress, phase_of

LOG_NAME = "mpstudio.log"
# Seconds between two redraws of a bar: a few a second reads as live without flooding a slow terminal.
REDRAW_INTERVAL = 0.25
# No rate or time left: a phase's steps (plans, models) restart its count, so tqdm's estimates would mislead.
_BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"


class PhaseBars:
    """A `progress(done, total, message)` callback drawing one tqdm bar per phase (`phase_of`): the phase is the
    bar's label and the rest of the message its postfix; a new phase closes the bar of the last one."""

    def __init__(self, stream):
        self.stream = stream
        self._bar, self._phase = None, None

    def __call__(self, done: int, total: int, message: str) -> None:
        from tqdm import tqdm

        phase = phase_of(message)
        if phase != self._phase or self._bar is None:
            self.close()
            self._bar = tqdm(total=total, desc=phase, file=self.stream, leave=False, dynamic_ncols=True,
                             mininterval=REDRAW_INTERVAL, miniters=1, bar_format=_BAR_FORMAT)
            self._phase = phase
        bar = self._bar
        bar.total = total
        if done < bar.n:  # the next step of the phase (another plan, another model) counts from its start
            bar.n = bar.last_print_n = done
        bar.set_postfix_str(_detail(message, phase), refresh=False)
        bar.update(done - bar.n)  # tqdm redraws at most every `mininterval` seconds

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class Console:
    """The progress callback of one command, and where the native log goes (`log_to`)."""

    def __init__(self, enabled: bool):
        self.enabled, self.log_path = enabled, None
        sys.stderr.flush()
        # The terminal as it was: bars and error lines keep writing to it while fd 2 goes to the log.
        self._terminal_fd = os.dup(2)
        self.terminal = os.fdopen(self._terminal_fd, "w", buffering=1, closefd=True)
        self._draw = PhaseBars(self.terminal) if _is_tty(self.terminal) else LineProgress(self.terminal)
        # Until the study's folder is known, native log lines wait in a scratch file.
        self._scratch = tempfile.TemporaryFile()
        os.dup2(self._scratch.fileno(), 2)

    def __call__(self, done: int, total: int, message: str) -> None:
        if self.enabled:
            self._draw(done, total, message)

    def log_to(self, folder: str | Path) -> Path:
        """Send the native log from here on (and what it wrote so far) to `folder`'s mpstudio.log."""
        from ..runtime import quiet_native_logs

        quiet_native_logs()
        path = Path(folder) / LOG_NAME
        sys.stderr.flush()
        self._scratch.seek(0)
        with open(path, "ab") as log:
            log.write(self._scratch.read())
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, 2)
        os.close(target)
        self.log_path = path
        return path

    def close(self, error: BaseException | None) -> None:
        """Put fd 2 back; what went to the scratch file (no study was opened) goes to the terminal."""
        if isinstance(self._draw, PhaseBars):
            self._draw.close()
        if error is not None and self.log_path is not None and not isinstance(error, KeyboardInterrupt):
            sys.stderr.write("".join(traceback.format_exception(error)))
        sys.stderr.flush()
        os.dup2(self._terminal_fd, 2)
        if self.log_path is None:
            self._scratch.seek(0)
            self.terminal.write(self._scratch.read().decode(errors="replace"))
        self._scratch.close()
        self.terminal.close()


def _detail(message: str, phase: str) -> str:
    """What a message says beyond its phase (the plan, its value, the model file), shortened for a bar."""
    if message.startswith(phase):
        rest = message[len(phase):].lstrip(": ")
    else:
        rest = " ".join(word for word in message.split() if word not in phase.split())
    return rest if len(rest) <= 48 else rest[:47] + "…"


def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


@contextmanager
def progress_bar(enabled: bool = True):
    """A `Console`: a `progress(done, total, message)` callback for the command (see the module docstring).

    Once `log_to(folder)` was called, an error leaves as one `MpstudioError` naming the log (a user's mistake
    whole, anything else as its first line), and its traceback goes to the log."""
    console = Console(enabled)
    try:
        yield console
    except Exception as exc:
        console.close(exc)
        if console.log_path is None:
            raise
        # A user's mistake is explained whole (what is wrong, what to do); anything else in its first line.
        text = str(exc).strip() if isinstance(exc, MpstudioError) else \
            (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise MpstudioError(f"{text} (details in {console.log_path})") from exc
    except BaseException as exc:
        console.close(exc)
        raise
    else:
        console.close(None)
