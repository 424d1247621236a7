#!/usr/bin/env python3
"""Generate bpf/helpers.py: the BPF helper id -> name table.

Sources (both are read; the table is their union):
- the kernel uapi header linux/bpf.h, macro ___BPF_FUNC_MAPPER (newer
  headers: FN(name, id, ##ctx), explicit ids) or __BPF_FUNC_MAPPER (older
  headers: FN(name), the id is the position in the list);
- libbpf's bpf/bpf_helper_defs.h, one `static T (*bpf_name)(...) = (void *) N;`
  per helper. It is often newer than the distro's uapi header, which may be
  older than the running kernel.
If the two sources give one id two names (or one name two ids) generation
fails: the table must be right, since the broker's audit trusts it.

Usage: python3 tools/gen_helpers.py [--uapi PATH] [--libbpf PATH] [-o OUT] [--check]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

DEFAULT_UAPI = "/usr/include/linux/bpf.h"
DEFAULT_LIBBPF = "/usr/include/bpf/bpf_helper_defs.h"
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "bpf" / "helpers.py"


class GenError(Exception):
    """The headers could not be read, parsed or merged."""


_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)
_LINE_COMMENT = re.compile(r"//[^\n]*")
_CONTINUATION = re.compile(r"\\[ \t]*\n")
_MAPPER_DEFINE = re.compile(
    r"^[ \t]*#[ \t]*define[ \t]+(_{2,3}BPF_FUNC_MAPPER)[ \t]*\(([^)]*)\)(.*)$"
)
_FN_ENTRY = re.compile(r"\bFN\s*\(\s*(\w+)\s*(?:,\s*(\d+)\s*)?(?:,[^)]*)?\)")
_LIBBPF_DEF = re.compile(
    r"\(\s*\*\s*(?:const\s+)?bpf_(\w+)\s*\)\s*\([^;]*?\)\s*=\s*\(\s*void\s*\*\s*\)\s*(\d+)\s*;"
)


def _strip_comments(text: str) -> str:
    # Comments become a space so a comment that ends a macro does not glue
    # the following line onto it.
    return _LINE_COMMENT.sub(" ", _COMMENT.sub(" ", text))


def parse_uapi(text: str) -> dict[int, str]:
    """Helper ids from the FUNC_MAPPER macro of linux/bpf.h (old or new style)."""
    logical = _CONTINUATION.sub(" ", _strip_comments(text))
    candidates: list[list[tuple[str, str]]] = []
    for line in logical.splitlines():
        m = _MAPPER_DEFINE.match(line)
        if not m:
            continue
        entries = _FN_ENTRY.findall(m.group(3))
        # The list proper starts with unspec; other defines with the same
        # prefix are compatibility wrappers around it.
        if entries and entries[0][0] == "unspec":
            candidates.append(entries)
    if not candidates:
        raise GenError(
            "no __BPF_FUNC_MAPPER / ___BPF_FUNC_MAPPER helper list starting with "
            "FN(unspec...) found: is this the kernel uapi linux/bpf.h?"
        )
    entries = candidates[0]
    with_ids = [e for e in entries if e[1]]
    if with_ids and len(with_ids) != len(entries):
        raise GenError("helper list mixes FN(name) and FN(name, id) entries: cannot assign ids")
    table: dict[int, str] = {}
    for pos, (name, explicit) in enumerate(entries):
        hid = int(explicit) if explicit else pos
        _add(table, hid, name, "linux/bpf.h")
    return table


def parse_libbpf(text: str) -> dict[int, str]:
    """Helper ids from libbpf's bpf_helper_defs.h."""
    table: dict[int, str] = {}
    for name, num in _LIBBPF_DEF.findall(_strip_comments(text)):
        _add(table, int(num), name, "bpf_helper_defs.h")
    if not table:
        raise GenError(
            "no `static T (*bpf_x)(...) = (void *) N;` definitions found: "
            "is this libbpf's bpf_helper_defs.h?"
        )
    return table


def _add(table: dict[int, str], hid: int, name: str, source: str) -> None:
    if hid in table and table[hid] != name:
        raise GenError(f"{source}: helper id {hid} appears as both {table[hid]!r} and {name!r}")
    table[hid] = name


def merge(uapi: dict[int, str], libbpf: dict[int, str]) -> dict[int, str]:
    """Union of two tables; any disagreement on an id or a name is an error."""
    merged = dict(uapi)
    for hid, name in libbpf.items():
        if hid in merged and merged[hid] != name:
            raise GenError(
                f"headers disagree on helper id {hid}: linux/bpf.h says {merged[hid]!r}, "
                f"bpf_helper_defs.h says {name!r}; check that both headers are intact"
            )
        merged[hid] = name
    seen: dict[str, int] = {}
    for hid in sorted(merged):
        name = merged[hid]
        if name in seen:
            raise GenError(f"helper {name!r} has two ids, {seen[name]} and {hid}")
        seen[name] = hid
    return merged


def render(table: dict[int, str], command: str) -> str:
    """The text of bpf/helpers.py (already in ruff format style)."""
    rows = "".join(f'    {hid}: "{table[hid]}",\n' for hid in sorted(table))
    return f'''"""BPF helper function ids -> names (without the bpf_ prefix).

GENERATED FILE, do not edit. Regenerate with:
    {command}
It is the union of the kernel uapi helper list (linux/bpf.h) and libbpf's
bpf_helper_defs.h. tests/unit/test_insn.py checks it against the headers.
"""

from __future__ import annotations

HELPERS: dict[int, str] = {{
{rows}}}

HELPER_IDS: dict[str, int] = {{name: hid for hid, name in HELPERS.items()}}


def helper_name(helper_id: int) -> str:
    """Name of helper `helper_id` (e.g. 14 -> "get_current_pid_tgid"), "helper#N" if unknown."""
    return HELPERS.get(helper_id, f"helper#{{helper_id}}")


def helper_id(name: str) -> int | None:
    """Id of helper `name`, with or without the bpf_ prefix; None if unknown."""
    if name not in HELPER_IDS and name.startswith("bpf_"):
        name = name[4:]
    return HELPER_IDS.get(name)
'''


def _read(path: str, what: str, package: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise GenError(f"cannot read {what} {path}: {e.strerror}; install {package}") from e


def generate(uapi_path: str = DEFAULT_UAPI, libbpf_path: str = DEFAULT_LIBBPF) -> str:
    uapi = parse_uapi(_read(uapi_path, "uapi header", "linux-libc-dev"))
    libbpf = parse_libbpf(_read(libbpf_path, "libbpf header", "libbpf-dev"))
    command = "python3 tools/gen_helpers.py"
    # Record non-default sources so the header says exactly how to reproduce.
    if uapi_path != DEFAULT_UAPI:
        command += f" --uapi {uapi_path}"
    if libbpf_path != DEFAULT_LIBBPF:
        command += f" --libbpf {libbpf_path}"
    return render(merge(uapi, libbpf), command)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Generate bpf/helpers.py from the BPF headers.")
    ap.add_argument("--uapi", default=DEFAULT_UAPI, help="path of linux/bpf.h")
    ap.add_argument("--libbpf", default=DEFAULT_LIBBPF, help="path of bpf/bpf_helper_defs.h")
    ap.add_argument("-o", "--output", default=str(DEFAULT_OUT), help="file to write")
    ap.add_argument(
        "--check", action="store_true", help="do not write; exit 1 if OUTPUT is out of date"
    )
    args = ap.parse_args(argv)
    try:
        text = generate(args.uapi, args.libbpf)
    except GenError as e:
        print(f"gen_helpers: {e}", file=sys.stderr)
        return 2
    out = Path(args.output)
    if args.check:
        current = out.read_text(encoding="utf-8") if out.exists() else ""
        if current != text:
            print(f"gen_helpers: {out} is out of date; rerun without --check", file=sys.stderr)
            return 1
        return 0
    out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
