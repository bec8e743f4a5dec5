"""`.env` of the repository root, read at start like the TypeScript CLI and workers do (host/env-file.ts).

KEY=value lines (`export KEY=value` too), `#` comments, values in single or double quotes (double quotes
understand \\n). A variable already in the environment, even empty, is never overridden; a missing file is
fine. HALO_ENV_FILE names another file (empty: none).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import MutableMapping

from .paths import REPO_ROOT

_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.-]*)\s*=\s*(.*)$")


def parse_env(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        key, value = m.group(1), m.group(2).strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'`":
            quote, value = value[0], value[1:-1]
            if quote == '"':
                value = value.replace("\\n", "\n")
        else:
            value = re.split(r"\s+#|^#", value, maxsplit=1)[0].strip()
        out[key] = value
    return out


def load_dotenv(env: MutableMapping[str, str] = os.environ, path: str | os.PathLike | None = None) -> list[str]:
    """Fills in from the file what `env` does not set; returns the names it set."""
    if path is None:
        path = env.get("HALO_ENV_FILE", str(REPO_ROOT / ".env"))
    if not path:
        return []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    added = []
    for key, value in parse_env(text).items():
        if key in env:
            continue
        env[key] = value
        added.append(key)
    return added
