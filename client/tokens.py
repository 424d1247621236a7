"""A per-user cache of gRPC tokens, so each gfxclient run does not issue a new one.

The broker keeps a few unexpired tokens per user (policy tokens_per_user, 4
by default; a new one replaces the oldest that no client is using, and is
refused when all are in use) and a token lives up to an hour, so issuing
one per command would use up the user's tokens. A token is a credential:
the cache is a 0600 file in a 0700
directory the user owns, the first usable of $XDG_RUNTIME_DIR/gfxbpf,
$XDG_CACHE_HOME/gfxbpf/tokens (~/.cache/gfxbpf/tokens) and
$TMPDIR/gfxbpf-<uid>. A directory that is anything else (another owner, a
symlink, group/other access), or that sits in a folder another user could
rename it out of, is not used: anyone can create /tmp/gfxbpf-<uid> first, so
the home's comes before it. Set GFXBPF_TOKEN_CACHE=0 to turn the cache off.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

FILE_NAME = "tokens.json"
# A cached token is reused while it has at least a quarter of its life (and a
# minute) left, so a new command does not start with a token about to expire.
MIN_REMAINING = 60
REMAINING_FRACTION = 0.25
MAX_FILE = 64 * 1024


def _private_dir(path: Path) -> bool:
    """Create path 0700 if missing; True if it is a real directory only we can use."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        st = os.lstat(path)
    except OSError:
        return False
    uid = os.getuid()
    if not (stat.S_ISDIR(st.st_mode) and st.st_uid == uid and (st.st_mode & 0o077) == 0):
        return False
    return _steady(path.parent)


def _steady(folder: Path) -> bool:
    """True if no other user can rename what folder holds: it and every folder
    above it belong to us or root and others cannot write them (but sticky
    ones, like /tmp, where only an entry's owner may move it)."""
    uid = os.getuid()
    for p in (folder, *folder.parents):
        st = os.stat(p)
        if st.st_uid not in (uid, 0):
            return False
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return False
    return True


def _home_dir() -> Path | None:
    """$XDG_CACHE_HOME/gfxbpf/tokens (default ~/.cache), its parents made 0700."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.path.isabs(base):
        return None  # no home ("~" unexpanded) or a relative setting
    folder = Path(base) / "gfxbpf"
    with contextlib.suppress(OSError):
        os.makedirs(folder, 0o700, exist_ok=True)
    return folder / "tokens"


def cache_dir() -> Path | None:
    if os.environ.get("GFXBPF_TOKEN_CACHE", "1") in ("0", "no", "false"):
        return None
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    candidates = [Path(runtime) / "gfxbpf"] if runtime else []
    home = _home_dir()
    if home is not None:
        candidates.append(home)
    candidates.append(Path(tempfile.gettempdir()) / f"gfxbpf-{os.getuid()}")
    for path in candidates:
        try:
            if _private_dir(path):
                return path
        except OSError:
            continue
    return None


def cache_key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


class TokenCache:
    """Tokens by key (the broker's socket and gRPC address); expired ones dropped."""

    def __init__(
        self, directory: Path | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.directory = directory if directory is not None else cache_dir()
        self._clock = clock

    def _path(self) -> Path | None:
        return None if self.directory is None else self.directory / FILE_NAME

    def _load(self) -> dict[str, dict[str, object]]:
        path = self._path()
        if path is None:
            return {}
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return {}
        try:
            st = os.fstat(fd)
            if st.st_uid != os.getuid() or st.st_mode & 0o077 or st.st_size > MAX_FILE:
                return {}
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = json.loads(f.read(MAX_FILE))
        except (OSError, ValueError):
            return {}
        finally:
            os.close(fd)
        return data if isinstance(data, dict) else {}

    def _store(self, data: dict[str, dict[str, object]]) -> None:
        path = self._path()
        if path is None:
            return
        tmp = path.with_name(f".{FILE_NAME}.{os.getpid()}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError:
            return
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def get(self, key: str) -> str | None:
        entry = self._load().get(key)
        if not isinstance(entry, dict):
            return None
        token, expires = entry.get("token"), entry.get("expires")
        issued = entry.get("issued", 0)
        if not isinstance(token, str) or not isinstance(expires, int | float):
            return None
        if not isinstance(issued, int | float):
            issued = 0
        now = self._clock()
        life = max(0.0, expires - issued) if issued else 0.0
        if expires - now < max(MIN_REMAINING, life * REMAINING_FRACTION):
            return None
        return token

    def put(self, key: str, token: str, expires: int) -> None:
        now = self._clock()
        data = {k: v for k, v in self._load().items() if _expiry(v) > now}
        data[key] = {"token": token, "expires": int(expires), "issued": int(now)}
        self._store(data)

    def forget(self, key: str) -> None:
        data = self._load()
        if data.pop(key, None) is not None:
            self._store(data)


def _expiry(entry: object) -> float:
    """A cache entry's expiry time (unix seconds); -inf (expired) without a number there."""
    if not isinstance(entry, dict):
        return -math.inf
    expires = entry.get("expires")
    return expires if isinstance(expires, int | float) else -math.inf
