"""Writing a Profile: the formats gfxclient profile offers, and the top table."""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING

from gfxbpf.client.profiles.top import format_top, top_functions

if TYPE_CHECKING:
    from gfxbpf.client.profiles.model import Profile

__all__ = [
    "FORMATS",
    "check_writable",
    "format_of",
    "format_top",
    "render",
    "top_functions",
    "write_profile",
]

FORMATS = ("folded", "pprof", "speedscope", "svg")
# A file name's ending -> the format written under it (longest endings first).
SUFFIXES = (
    (".speedscope.json", "speedscope"),
    (".json", "speedscope"),
    (".pb.gz", "pprof"),
    (".pprof", "pprof"),
    (".folded", "folded"),
    (".collapsed", "folded"),
    (".txt", "folded"),
    (".svg", "svg"),
)


def format_of(path: str) -> str:
    """The format a file's name asks for; ValueError names the endings known
    (an .html or a name without one would otherwise get an SVG it does not expect)."""
    name = path.lower()
    for suffix, fmt in SUFFIXES:
        if name.endswith(suffix):
            return fmt
    known = ", ".join(suffix for suffix, _ in SUFFIXES)
    html = (
        " (no HTML page is written: an .svg flame graph opens in any browser)"
        if name.endswith(".html")
        else ""
    )
    raise ValueError(f"cannot tell the format of {path!r} from its name{html}: end it in {known}")


def render(profile: Profile, fmt: str, title: str = "gfxbpf profile") -> bytes:
    """The file's bytes in format fmt (one of FORMATS)."""
    # Each writer is imported when its format is asked for: gfxclient's parser
    # needs FORMATS on every run, the writers only after a profile (issue #15).
    if fmt == "folded":
        from gfxbpf.client.profiles.folded import format_folded

        return format_folded(profile).encode("utf-8")
    if fmt == "pprof":
        from gfxbpf.client.profiles.pprof import pprof_bytes

        return pprof_bytes(profile)
    if fmt == "speedscope":
        from gfxbpf.client.profiles.speedscope import format_speedscope

        return format_speedscope(profile).encode("utf-8")
    if fmt == "svg":
        from gfxbpf.client.profiles.flamegraph import flamegraph_svg

        return flamegraph_svg(profile, title).encode("utf-8")
    raise ValueError(f"unknown profile format {fmt!r}: choose one of {', '.join(FORMATS)}")


def write_profile(profile: Profile, fmt: str, path: str) -> None:
    """Write atomically: a reader (or a crash) never sees half a file.
    Raises ValueError for an unknown format, OSError when path cannot be written."""
    data = render(profile, fmt)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".gfxbpf-profile-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def check_writable(path: str) -> None:
    """Raise OSError now if write_profile could not write path: checked before
    a profile is taken, so that a mistyped folder does not lose a long run's
    profile at its end. The check is what writing does: a file made in the
    folder (then removed), and path not a folder."""
    if os.path.isdir(path):
        raise IsADirectoryError(21, "it is a folder; give a file name in it")
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".gfxbpf-check-")
    os.close(fd)
    os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
