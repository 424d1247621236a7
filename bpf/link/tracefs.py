"""tracefs: where it is mounted, tracepoint ids, and the `format` file parser.

The broker reads a tracepoint's id to attach to it and its `format` file to
learn field offsets on the running kernel (layouts move between releases).
Nothing here writes to tracefs.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, field

__all__ = [
    "EventFormat",
    "Field",
    "FormatError",
    "TracefsError",
    "TracepointNotFound",
    "event_exists",
    "event_id",
    "parse_format",
    "read_format",
    "tracefs_root",
    "validate_name",
]

from gfxbpf.bpf.errors import HostError, InputError

MOUNT_HINT = "mount it with `mount -t tracefs nodev /sys/kernel/tracing` (as root)"

# A format file is a few KiB; anything far larger is not one.
MAX_FORMAT_BYTES = 1 << 20
MAX_FIELDS = 4096
# Trace records live in ring-buffer pages; offsets beyond this are corrupt.
MAX_RECORD_OFFSET = 1 << 20

_NAME_RE = re.compile(r"[A-Za-z0-9_]+")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class TracefsError(OSError, HostError):
    """tracefs is missing, unreadable, or an event is not there."""


class TracepointNotFound(TracefsError):
    """The tracepoint does not exist on this kernel."""


class FormatError(ValueError, InputError):
    """A `format` file that does not parse."""


@dataclass(frozen=True)
class Field:
    """One field of a trace record.

    `type` is the C type as the kernel printed it, with an array suffix
    moved off the name ("char[16]", "__data_loc char[]"). `array_len` is
    None for scalars, the element count for fixed arrays, 0 for `[]`.
    `is_data_loc` fields hold a u32: low 16 bits the offset of the data
    from the record start, high 16 bits its length; `is_rel_loc` is the
    same but the offset counts from the end of the field.
    """

    name: str
    type: str
    offset: int
    size: int
    signed: bool
    is_data_loc: bool = False
    array_len: int | None = None
    is_rel_loc: bool = False

    @property
    def is_common(self) -> bool:
        """The 8-byte header every record carries (not readable by programs)."""
        return self.name.startswith("common_")


@dataclass(frozen=True)
class EventFormat:
    name: str
    id: int
    fields: dict[str, Field] = field(default_factory=dict)
    print_fmt: str = ""

    @property
    def event_fields(self) -> dict[str, Field]:
        """The fields after the common header, in record order."""
        return {k: v for k, v in self.fields.items() if not v.is_common}


def validate_name(kind: str, name: str) -> str:
    """Refuse anything that is not a plain tracefs name before it reaches a path."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(
            f"invalid tracepoint {kind} {name!r}: only letters, digits and '_' are allowed"
        )
    return name


def _unescape_mount(s: str) -> str:
    # /proc/self/mounts escapes space, tab, newline and backslash as \ooo.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def _mounts(path: str = "/proc/self/mounts") -> list[tuple[str, str]]:
    """(mount point, fs type) pairs."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read(MAX_FORMAT_BYTES * 4).splitlines()
    except OSError as e:
        raise TracefsError(e.errno or errno.EIO, f"cannot read {path}: {e.strerror}") from e
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 3:
            out.append((_unescape_mount(parts[1]), parts[2]))
    return out


def tracefs_root(mounts_file: str = "/proc/self/mounts") -> str:
    """The directory holding `events/`: a tracefs mount, else debugfs/tracing."""
    candidates: list[str] = []
    mounts = _mounts(mounts_file)
    for mnt, fstype in mounts:
        if fstype == "tracefs":
            candidates.append(mnt)
    for mnt, fstype in mounts:
        if fstype == "debugfs":
            candidates.append(os.path.join(mnt, "tracing"))
    denied: str | None = None
    for root in candidates:
        events = os.path.join(root, "events")
        try:
            os.stat(events)
        except PermissionError:
            denied = root
            continue
        except OSError:
            continue
        if not os.access(events, os.R_OK | os.X_OK):
            denied = root
            continue
        return root
    if denied is not None:
        raise TracefsError(
            errno.EACCES,
            f"permission denied reading tracefs at {denied}: reading tracepoint ids "
            "needs root (the gfxbpf broker reads them for you)",
        )
    raise TracefsError(errno.ENOENT, f"tracefs is not mounted; {MOUNT_HINT}")


def _event_dir(category: str, event: str, root: str | None) -> str:
    validate_name("category", category)
    validate_name("event", event)
    return os.path.join(root or tracefs_root(), "events", category, event)


def _read_small(path: str, what: str, limit: int) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except PermissionError as e:
        raise TracefsError(
            errno.EACCES, f"permission denied reading {path} ({what}): needs root"
        ) from e
    except FileNotFoundError as e:
        raise TracepointNotFound(
            errno.ENOENT, f"tracepoint {what} does not exist on this kernel (no {path})"
        ) from e
    except OSError as e:
        raise TracefsError(e.errno or errno.EIO, f"cannot read {path}: {e.strerror}") from e
    if len(data) > limit:
        raise TracefsError(errno.EFBIG, f"{path} is larger than {limit} bytes")
    return data.decode("utf-8", errors="replace")


def event_exists(category: str, event: str, root: str | None = None) -> bool:
    """True if tracefs lists the event (raises if tracefs itself is unusable)."""
    d = _event_dir(category, event, root)
    return os.path.isfile(os.path.join(d, "id")) or os.path.isfile(os.path.join(d, "format"))


def event_id(category: str, event: str, root: str | None = None) -> int:
    """The id perf_event_open takes as config for PERF_TYPE_TRACEPOINT."""
    d = _event_dir(category, event, root)
    text = _read_small(os.path.join(d, "id"), f"{category}:{event}", 64).strip()
    if not text.isdigit() or int(text) > 0xFFFFFFFF:
        raise TracefsError(errno.EINVAL, f"{d}/id holds {text!r}, not an event id")
    return int(text)


def read_format(category: str, event: str, root: str | None = None) -> EventFormat:
    d = _event_dir(category, event, root)
    text = _read_small(os.path.join(d, "format"), f"{category}:{event}", MAX_FORMAT_BYTES)
    try:
        return parse_format(text)
    except FormatError as e:
        raise FormatError(f"{d}/format: {e}") from None


_FIELD_RE = re.compile(
    r"field:(?P<decl>[^;]*);\s*offset:(?P<offset>-?\d+);\s*size:(?P<size>-?\d+);"
    r"(?:\s*signed:(?P<signed>-?\d+);)?"
)
_ARRAY_RE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*\[(?P<len>[^\]]*)\]$")


def _parse_decl(decl: str, lineno: int) -> tuple[str, str, int | None, bool, bool]:
    """'__data_loc char[] name' -> (name, type, array_len, data_loc, rel_loc)."""
    decl = " ".join(decl.split())
    if not decl:
        raise FormatError(f"line {lineno}: empty field declaration")
    # The name is the last token; an array suffix may be glued to it.
    head, _, last = decl.rpartition(" ")
    if not head:
        raise FormatError(f"line {lineno}: field {decl!r} has no type")
    array_len: int | None = None
    m = _ARRAY_RE.match(last)
    if m:
        name = m.group("name")
        inner = m.group("len").strip()
        if inner == "":
            array_len = 0
        elif inner.isdigit():
            array_len = int(inner)
        else:
            array_len = None  # a symbolic length the kernel did not expand
        typ = f"{head}[{inner}]"
    else:
        name = last
        typ = head
        # '__data_loc char[]' carries the brackets on the type.
        if typ.endswith("[]"):
            array_len = 0
    if not _IDENT_RE.fullmatch(name):
        raise FormatError(f"line {lineno}: bad field name {name!r} in {decl!r}")
    data_loc = typ.startswith("__data_loc ")
    rel_loc = typ.startswith("__rel_loc ")
    return name, typ, array_len, data_loc, rel_loc


def parse_format(text: str) -> EventFormat:
    """Parse a tracefs `format` file (name, ID, fields, print fmt)."""
    if not isinstance(text, str):
        raise FormatError("format text must be str")
    if len(text) > MAX_FORMAT_BYTES:
        raise FormatError(f"format text longer than {MAX_FORMAT_BYTES} bytes")
    name: str | None = None
    ev_id: int | None = None
    fields: dict[str, Field] = {}
    print_fmt = ""
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith("name:"):
            name = _parse_name_line(line, lineno)
        elif line.startswith("ID:"):
            ev_id = _parse_id_line(line, lineno)
        elif line.startswith("field:") or line.startswith("field "):
            _add_field(fields, _parse_field_line(line, lineno), lineno)
        elif line.startswith("print fmt:"):
            print_fmt = line[len("print fmt:") :].strip()
        # Anything else (blank lines, "format:", future headers) is ignored on purpose.
    if name is None:
        raise FormatError("no 'name:' line: not a tracefs format file")
    if ev_id is None:
        raise FormatError(f"event {name}: no 'ID:' line")
    if not fields:
        raise FormatError(f"event {name}: no fields")
    return EventFormat(name=name, id=ev_id, fields=fields, print_fmt=print_fmt)


def _parse_name_line(line: str, lineno: int) -> str:
    name = line[5:].strip()
    if not _NAME_RE.fullmatch(name):
        raise FormatError(f"line {lineno}: bad event name {name!r}")
    return name


def _parse_id_line(line: str, lineno: int) -> int:
    v = line[3:].strip()
    if not v.isdigit() or int(v) > 0xFFFFFFFF:
        raise FormatError(f"line {lineno}: bad ID {v!r}")
    return int(v)


def _parse_field_line(line: str, lineno: int) -> Field:
    """One 'field:' (or 'field special:') line."""
    if line.startswith("field special:"):
        line = "field:" + line[len("field special:") :]
    m = _FIELD_RE.match(line)
    if not m:
        raise FormatError(f"line {lineno}: cannot parse field line {line!r}")
    fname, typ, alen, data_loc, rel_loc = _parse_decl(m.group("decl"), lineno)
    offset, size = int(m.group("offset")), int(m.group("size"))
    if not (0 <= offset < MAX_RECORD_OFFSET and 0 <= size < MAX_RECORD_OFFSET):
        raise FormatError(
            f"line {lineno}: field {fname}: offset {offset} / size {size} out of range"
        )
    signed = m.group("signed")
    return Field(
        name=fname,
        type=typ,
        offset=offset,
        size=size,
        signed=signed is not None and int(signed) != 0,
        is_data_loc=data_loc,
        array_len=alen,
        is_rel_loc=rel_loc,
    )


def _add_field(fields: dict[str, Field], f: Field, lineno: int) -> None:
    if f.name in fields:
        raise FormatError(f"line {lineno}: field {f.name} declared twice")
    if len(fields) >= MAX_FIELDS:
        raise FormatError(f"more than {MAX_FIELDS} fields")
    fields[f.name] = f
