"""Print ``export`` lines that give uv the package sources pip is configured with (uv reads no
pip.conf): index, extra indexes, local wheel folders and the CA bundle, from ``pip config list``."""

from __future__ import annotations

import shlex
import subprocess
import sys

UV_ENV = {
    "index-url": "UV_INDEX_URL",
    "extra-index-url": "UV_EXTRA_INDEX_URL",
    "find-links": "UV_FIND_LINKS",
    "cert": "SSL_CERT_FILE",
}

out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
seen: dict[str, str] = {}
for line in out.splitlines():  # e.g. global.find-links='/some/dir'
    key, sep, value = line.partition("=")
    name = key.rsplit(".", 1)[-1]
    if sep and name in UV_ENV and name not in seen:
        seen[name] = value.strip().strip("'\"")
for name, value in seen.items():
    print(f"export {UV_ENV[name]}={shlex.quote(value)}")
if "extra-index-url" in seen or "find-links" in seen:
    # pip takes the best version from every source; uv by default only from the first that has it.
    print("export UV_INDEX_STRATEGY=unsafe-best-match")
