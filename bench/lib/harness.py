"""What every runner does around its measurements: the report's ``meta``, SIGTERM handled like
Ctrl-C, the report written at the end whatever happened (a partial one, with the error, when a
phase failed or the run was stopped), an optional deadline watchdog, and paths recorded relative
to the output directory: a file the run wrote there from there (``profile/acoustic_c8.txt``), a
file of this repository from its root, anything else by its last component only (no absolute path
of the machine that ran it ends up in a report).

    with Harness(out, render, argv, quick=True) as h:
        h.report["ceiling"] = ...
        h.write()            # any time: a partial report
    # on exit: meta.finished, wall_s, loadavg_end; report["error"] if it raised; written once more
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .procs import REPO_ROOT, kill_descendants, load_average


def now() -> str:
    return dt.datetime.now().astimezone().isoformat(timespec="seconds")


def git_revision() -> str:
    """Short HEAD, ``+dirty`` with uncommitted changes; ``unknown`` outside git."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5, cwd=REPO_ROOT
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], capture_output=True, text=True, timeout=5, cwd=REPO_ROOT
        ).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except Exception:  # noqa: BLE001
        return "unknown"


def logger(name: str) -> Callable[[str], None]:
    """``log("...")`` prints ``[name HH:MM:SS] ...`` and flushes (the output of a subprocess
    goes to a log file that is read while it runs)."""

    def log(msg: str) -> None:
        print(f"[{name} {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    return log


def ints(s: str) -> list[int]:
    """argparse type: ``1,8,16`` -> [1, 8, 16]."""
    return [int(x) for x in s.split(",") if x.strip()]


def floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x.strip()]


# ------------------------------------------------------------------ paths in reports


def relative_path(path: str | os.PathLike, out: Optional[Path]) -> str:
    """``path`` as a report records it (see the module docstring)."""
    p = Path(path)
    absolute = p.absolute()
    for root, empty in ((out, "."), (REPO_ROOT, ".")):
        if root is None:
            continue
        try:
            rel = absolute.relative_to(Path(root).absolute())
        except ValueError:
            continue
        return rel.as_posix() if rel.parts else empty
    return str(p) if not p.is_absolute() else p.name


def command_line(argv: Sequence[str], out: Optional[Path], prefix: str = "python -m bench") -> str:
    """The command as typed, quoted, with every path in it (an argument, or the value of
    ``--opt=value``) that is absolute or inside ``out`` recorded by ``relative_path``."""

    def portable(token: str) -> str:
        opt, eq, value = token.partition("=") if token.startswith("-") else ("", "", token)
        if not value or (opt and not eq):
            return token
        p = Path(value)
        inside = out is not None and (
            p.absolute() == Path(out).absolute() or Path(out).absolute() in p.absolute().parents
        )
        if not (p.is_absolute() or inside):
            return token
        return opt + eq + relative_path(value, out)

    return " ".join([prefix, *(shlex.quote(portable(t)) for t in argv)]).strip()


# ------------------------------------------------------------------ the harness


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


class Harness:
    """One run's report, from its metadata to its last write (see the module docstring).

    ``render(report, out)`` writes the report's files; it is called by ``write()`` under a lock
    (the watchdog writes from its own thread). ``meta`` extras go into ``report["meta"]``. With
    ``out`` None nothing is written (the runner prints its report)."""

    def __init__(self, out: Optional[Path], render: Callable[[dict, Path], None], argv: Sequence[str], **meta: Any):
        self.out = Path(out) if out is not None else None
        self.render = render
        self.report: dict[str, Any] = {"meta": {}, "warnings": []}
        self.command = command_line(argv, self.out)
        self._extra_meta = meta
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._t0 = 0.0
        self._prev_handler: Any = None

    @property
    def meta(self) -> dict:
        return self.report["meta"]

    def __enter__(self) -> "Harness":
        import psutil

        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
        self._t0 = time.perf_counter()
        self.meta.clear()  # in place: callers may hold ``h.meta``
        self.meta.update(
            {
                "started": now(),
                "command": self.command,
                "git": git_revision(),
                "cpus": os.cpu_count(),
                "mem_gib": round(psutil.virtual_memory().total / 2**30, 1),
                "platform": f"{platform.system()} {platform.machine()} python {platform.python_version()}",
                "loadavg_start": load_average(),
                **self._extra_meta,
            }
        )
        if threading.current_thread() is threading.main_thread():
            self._prev_handler = signal.signal(signal.SIGTERM, _raise_interrupt)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._done.set()
        if self._prev_handler is not None:
            signal.signal(signal.SIGTERM, self._prev_handler)
        if exc is not None:
            self.report["error"] = f"{exc.__class__.__name__}: {exc}"
        self.meta["finished"] = now()
        self.meta["wall_s"] = round(time.perf_counter() - self._t0, 1)
        self.meta["loadavg_end"] = load_average()
        self.write()
        return False

    def warn(self, msg: str) -> None:
        self.report["warnings"].append(msg)

    def path(self, path: str | os.PathLike) -> str:
        """``path`` as this report records it."""
        return relative_path(path, self.out)

    def write(self) -> None:
        if self.out is None:
            return
        with self._lock:
            self.render(self.report, self.out)

    def watchdog(self, left_s: Callable[[], float], on_expiry: Callable[[], None], grace_s: float = 45.0) -> None:
        """Past the deadline (``left_s()`` seconds from now) and a grace for the step's own
        clean-up, whatever is stuck: ``on_expiry()``, write the report, stop every child process
        and exit 3."""

        def watch() -> None:
            if self._done.wait(max(0.0, left_s()) + grace_s):
                return
            self.warn(f"deadline + {grace_s:.0f} s passed inside a step: stopped")
            on_expiry()
            self.write()
            kill_descendants(os.getpid())
            os._exit(3)

        threading.Thread(target=watch, name="deadline-watchdog", daemon=True).start()
