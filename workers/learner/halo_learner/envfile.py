"""`.env` of the repository root, read at start like the TypeScript CLI and workers do (host/env-file.ts).

One grammar for both languages: the npm `dotenv` package's (`parse`, the version pinned in package.json), ported
here line for line so that the learner needs no extra package. `KEY=value` or `KEY: value`, `export ` allowed;
an unquoted value ends at the first `#` (with or without a space before it) and is trimmed; a value in single,
double or back quotes is taken as is, may span lines and may be followed by a comment; in double quotes `\\n`
and `\\r` become a newline and a carriage return; lines that are not assignments are skipped; the last
assignment of a key wins. test/fixtures/dotenv/ holds the file both sides are tested on. A variable already in
the environment, even empty, is never overridden; a missing file is fine. HALO_ENV_FILE names another file
(empty: none).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import MutableMapping

from .paths import REPO_ROOT

# JavaScript's `\s`, `.`, and multiline `^`/`$`, spelled out so that Python's regex matches as V8's does.
_S = "[\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"
_DOT = "[^\n\r\u2028\u2029]"
_BOL = "(?:\\A|(?<=[\n\r\u2028\u2029]))"
_EOL = "(?=[\n\r\u2028\u2029]|\\Z)"
# dotenv's LINE:
# /(?:^|^)\s*(?:export\s+)?([\w.-]+)(?:\s*=\s*?|:\s+?)(\s*'(?:\\'|[^'])*'|\s*"(?:\\"|[^"])*"|\s*`(?:\\`|[^`])*`|[^#\r\n]+)?\s*(?:#.*)?(?:$|$)/mg
_LINE = re.compile(
    _BOL
    + _S
    + "*(?:export"
    + _S
    + "+)?([A-Za-z0-9_.-]+)(?:"
    + _S
    + "*="
    + _S
    + "*?|:"
    + _S
    + "+?)"
    + "("
    + _S
    + "*'(?:\\\\'|[^'])*'|"
    + _S
    + '*"(?:\\\\"|[^"])*"|'
    + _S
    + "*`(?:\\\\`|[^`])*`|[^#\r\n]+)?"
    + _S
    + "*(?:#"
    + _DOT
    + "*)?"
    + _EOL
)
_JS_SPACE = "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"


def parse_env(text: str) -> dict[str, str]:
    """The key/value map of a `.env` text, as dotenv's parse() gives it."""
    text = re.sub(r"\r\n?", "\n", text)
    out: dict[str, str] = {}
    for m in _LINE.finditer(text):
        key, value = m.group(1), (m.group(2) or "").strip(_JS_SPACE)
        quote = value[:1]
        if len(value) >= 2 and quote in "'\"`" and value[-1] == quote:
            value = value[1:-1]
        if quote == '"':
            value = value.replace("\\n", "\n").replace("\\r", "\r")
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
