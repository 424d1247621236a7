#!/usr/bin/env python3
"""Measure a CPython release's struct layout from its own headers.

Given the include folder of an installed CPython (the one holding Python.h and
internal/: Debian's python3.X-dev, or a `make install` / pyenv prefix), this
writes a small C program that prints offsetof()/sizeof() of every field
gfxbpf.catalog.python.layouts records, compiles it with gcc -DPy_BUILD_CORE
against those headers, runs it and prints the result: as JSON (--json) or as
the PyLayout entry to paste into catalog/python/layouts.py.

    tools/python_layouts.py --include /usr/include/python3.11 --source "..."

Debian's multiarch pyconfig.h (usr/include/x86_64-linux-gnu/python3.X) is
found next to the include folder, so a chroot's headers work too. Nothing
is copied from the headers: the program only names fields.

It also prints the unicode state bit positions (set each bitfield to all ones
and read the word back), the frame-owner enum, the 3.14 _PyStackRef tag bits
and, for 3.13+, where each _Py_DebugOffsets field lies in the struct (what
gfxbpf.client.profiles.python.discover.debug_offsets reads from a binary).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

NONE = 0xFFFFFFFF

_HEADERS = {
    (3, 9): ["Python.h", "frameobject.h", "pycore_runtime.h", "pycore_interp.h"],
    (3, 10): ["Python.h", "frameobject.h", "pycore_runtime.h", "pycore_interp.h"],
    (3, 11): ["Python.h", "pycore_runtime.h", "pycore_interp.h", "pycore_frame.h"],
    (3, 12): ["Python.h", "pycore_runtime.h", "pycore_interp.h", "pycore_frame.h"],
    (3, 13): ["Python.h", "pycore_runtime.h", "pycore_interp.h", "pycore_frame.h"],
    (3, 14): [
        "Python.h",
        "pycore_runtime.h",
        "pycore_interp.h",
        "pycore_stackref.h",
        "pycore_interpframe.h",
    ],
}
_HEADERS[(3, 15)] = _HEADERS[(3, 14)]


def _off(struct: str, field: str) -> str:
    return f"offsetof({struct}, {field})"


def _frame_fields(v: tuple[int, int]) -> dict[str, str]:
    """The PyLayout frame fields as C expressions for version v."""
    if v <= (3, 10):
        f = "PyFrameObject"
        return {
            "tstate_frame": _off("PyThreadState", "frame"),
            "frame_kind": "0",
            "frame_code": _off(f, "f_code"),
            "frame_previous": _off(f, "f_back"),
            "frame_instr": _off(f, "f_lasti"),
            "frame_instr_kind": "0",
        }
    f = "_PyInterpreterFrame"
    out = {
        "frame_kind": "1",
        "frame_previous": _off(f, "previous"),
        "frame_owner": _off(f, "owner"),
    }
    if v <= (3, 12):
        out |= {
            "tstate_frame": _off("PyThreadState", "cframe"),
            "cframe_current_frame": _off("_PyCFrame", "current_frame"),
            "frame_code": _off(f, "f_code"),
            "frame_instr": _off(f, "prev_instr"),
            "frame_instr_kind": "1",
        }
    else:
        out |= {
            "tstate_frame": _off("PyThreadState", "current_frame"),
            "frame_code": _off(f, "f_executable"),
            "frame_instr": _off(f, "instr_ptr"),
            "frame_instr_kind": "2",
        }
    if v == (3, 11):
        out["frame_is_entry"] = _off(f, "is_entry")
    # The owner of the shim frame the eval loop pushes on entry: 3.12 and 3.13
    # call it FRAME_OWNED_BY_CSTACK; 3.14 FRAME_OWNED_BY_INTERPRETER (its
    # Python/ceval.c sets that; its FRAME_OWNED_BY_CSTACK is assigned nowhere).
    if v in ((3, 12), (3, 13)):
        out["owner_cstack"] = "FRAME_OWNED_BY_CSTACK"
    elif v >= (3, 14):
        out["owner_cstack"] = "FRAME_OWNED_BY_INTERPRETER"
    if v >= (3, 14):
        out["frame_code_tag_mask"] = "Py_TAG_BITS"
    return out


def layout_fields(v: tuple[int, int]) -> dict[str, str]:
    """Every PyLayout field (after version and source) as a C expression, or
    a plain number for the ones this version does not have."""
    code = "PyCodeObject"
    out = {
        "runtime_interp_head": _off("_PyRuntimeState", "interpreters.head"),
        "interp_tstate_head": _off(
            "PyInterpreterState", "tstate_head" if v <= (3, 10) else "threads.head"
        ),
        "tstate_next": _off("PyThreadState", "next"),
        "tstate_thread_id": _off("PyThreadState", "thread_id"),
        "tstate_frame": "",
        "cframe_current_frame": str(NONE),
        "frame_kind": "",
        "frame_code": "",
        "frame_code_tag_mask": "0",
        "frame_previous": "",
        "frame_instr": "",
        "frame_instr_kind": "",
        "frame_owner": str(NONE),
        "frame_is_entry": str(NONE),
        "owner_cstack": "0xFF",
        "code_adaptive": str(NONE) if v <= (3, 10) else _off(code, "co_code_adaptive"),
        "code_name": _off(code, "co_name"),
        "code_qualname": str(NONE) if v <= (3, 10) else _off(code, "co_qualname"),
        "code_filename": _off(code, "co_filename"),
        "code_firstlineno": _off(code, "co_firstlineno"),
        "code_linetable": _off(code, "co_lnotab" if v == (3, 9) else "co_linetable"),
        "unicode_state": _off("PyASCIIObject", "state"),
        "unicode_length": _off("PyASCIIObject", "length"),
        "unicode_ascii_data": "sizeof(PyASCIIObject)",
        "unicode_compact_data": "sizeof(PyCompactUnicodeObject)",
        "bytes_size": _off("PyBytesObject", "ob_base.ob_size"),
        "bytes_data": _off("PyBytesObject", "ob_sval"),
    }
    out.update(_frame_fields(v))
    return out


# _Py_DebugOffsets fields worth checking against the table (3.13+), by the
# PyLayout field each one mirrors; the struct path is the same in 3.13 and 3.14.
DEBUG_FIELDS = {
    "runtime_interp_head": "runtime_state.interpreters_head",
    "interp_tstate_head": "interpreter_state.threads_head",
    "tstate_next": "thread_state.next",
    "tstate_thread_id": "thread_state.thread_id",
    "tstate_frame": "thread_state.current_frame",
    "frame_previous": "interpreter_frame.previous",
    "frame_code": "interpreter_frame.executable",
    "frame_instr": "interpreter_frame.instr_ptr",
    "frame_owner": "interpreter_frame.owner",
    "code_adaptive": "code_object.co_code_adaptive",
    "code_name": "code_object.name",
    "code_qualname": "code_object.qualname",
    "code_filename": "code_object.filename",
    "code_firstlineno": "code_object.firstlineno",
    "code_linetable": "code_object.linetable",
    "unicode_state": "unicode_object.state",
    "unicode_length": "unicode_object.length",
    "unicode_ascii_data": "unicode_object.asciiobject_size",
    "bytes_size": "bytes_object.ob_size",
    "bytes_data": "bytes_object.ob_sval",
}

# The frame-owner enum (3.11+), printed whole for the record.
_OWNER_BASE = ("FRAME_OWNED_BY_THREAD", "FRAME_OWNED_BY_GENERATOR", "FRAME_OWNED_BY_FRAME_OBJECT")
_OWNERS = {
    (3, 11): _OWNER_BASE,
    (3, 12): (*_OWNER_BASE, "FRAME_OWNED_BY_CSTACK"),
    (3, 13): (*_OWNER_BASE, "FRAME_OWNED_BY_CSTACK"),
    (3, 14): (*_OWNER_BASE, "FRAME_OWNED_BY_INTERPRETER", "FRAME_OWNED_BY_CSTACK"),
    (3, 15): (*_OWNER_BASE, "FRAME_OWNED_BY_INTERPRETER"),  # CSTACK gone
}

# Bitfields of PyASCIIObject.state whose positions the decoder needs.
_STATE_BITS = ("kind", "compact", "ascii")


def _program(v: tuple[int, int]) -> str:
    lines = ["#define Py_BUILD_CORE 1"]
    lines += [f'#include "{h}"' for h in _HEADERS[v]]
    lines += [
        "#include <stddef.h>",
        "#include <stdio.h>",
        "#include <string.h>",
        "int main(void) {",
    ]
    lines.append('printf("{\\"PY_VERSION\\": \\"%s\\",\\n", PY_VERSION);')
    # A free-threaded build (configure --disable-gil) has its own layout.
    lines += ["#ifdef Py_GIL_DISABLED", 'printf("\\"free_threaded\\": 1,\\n");', "#endif"]
    for name, expr in layout_fields(v).items():
        lines.append(f'printf("\\"{name}\\": %lu,\\n", (unsigned long)({expr}));')
    for bit in _STATE_BITS:
        lines.append("{ PyASCIIObject o; unsigned int w; memset(&o, 0, sizeof o);")
        lines.append(f"  o.state.{bit} = ~0u; memcpy(&w, &o.state, sizeof w);")
        lines.append(f'  printf("\\"state_{bit}\\": %u,\\n", w); }}')
    for owner in _OWNERS.get(v, ()):
        lines.append(f'printf("\\"owner.{owner}\\": %d,\\n", (int){owner});')
    if v >= (3, 13):
        for name, path in DEBUG_FIELDS.items():
            expr = f"offsetof(_Py_DebugOffsets, {path})"
            lines.append(f'printf("\\"debug.{name}\\": %lu,\\n", (unsigned long)({expr}));')
        lines.append(
            'printf("\\"debug.version\\": %lu,\\n", '
            "(unsigned long)offsetof(_Py_DebugOffsets, version));"
        )
    lines.append('printf("\\"PY_VERSION_HEX\\": %lu}\\n", (unsigned long)PY_VERSION_HEX);')
    lines += ["return 0; }", ""]
    return "\n".join(lines)


def _include_args(include: str, scratch: str, pyconfig: str | None = None) -> list[str]:
    """-I flags: the folder holding pyconfig.h when it is elsewhere (a build
    tree), the folder, its internal/, and Debian's multiarch pyconfig.h."""
    args = ["-I", pyconfig] if pyconfig else []
    args += ["-I", include, "-I", os.path.join(include, "internal")]
    name = os.path.basename(os.path.normpath(include))
    multi = os.path.join(os.path.dirname(os.path.normpath(include)), "x86_64-linux-gnu", name)
    if os.path.isdir(multi):
        os.makedirs(os.path.join(scratch, "x86_64-linux-gnu"))
        os.symlink(multi, os.path.join(scratch, "x86_64-linux-gnu", name))
        args += ["-I", scratch]
    return args


def header_version(include: str) -> tuple[int, int]:
    with open(os.path.join(include, "patchlevel.h")) as f:
        text = f.read()
    major = re.search(r"#define\s+PY_MAJOR_VERSION\s+(\d+)", text)
    minor = re.search(r"#define\s+PY_MINOR_VERSION\s+(\d+)", text)
    if not major or not minor:
        raise ValueError(f"{include}: no version in patchlevel.h")
    return int(major.group(1)), int(minor.group(1))


def measure(include: str, cc: str = "gcc", pyconfig: str | None = None) -> dict[str, int | str]:
    """Compile and run the offsetof program against the headers in include
    (and the pyconfig.h in the folder pyconfig, for a build tree's)."""
    v = header_version(include)
    if v not in _HEADERS:
        raise ValueError(f"{include}: CPython {v} has no field list here")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "layout.c"), os.path.join(tmp, "layout")
        with open(src, "w") as f:
            f.write(_program(v))
        flags = ["-O0", "-w", "-o", exe, src]
        inc = _include_args(include, os.path.join(tmp, "inc"), pyconfig)
        subprocess.run([cc, *inc, *flags], check=True, capture_output=True, text=True)
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    result: dict[str, int | str] = json.loads(out)
    return result


def entry(values: dict[str, int | str], source: str) -> str:
    """The PyLayout literal for layouts.py."""
    hexv = int(values["PY_VERSION_HEX"])
    v = (hexv >> 24, (hexv >> 16) & 0xFF)
    lines = [f"    {v}: PyLayout(", f"        version={v},", f"        source={source!r},"]
    for name in layout_fields(v):
        val = int(values[name])
        lines.append(
            f"        {name}={'NONE' if val == NONE else hex(val) if val > 0xFF else val},"
        )
    if values.get("free_threaded"):
        lines.append("        free_threaded=True,")
    lines.append("    ),")
    return "\n".join(lines)


def debug_entry(values: dict[str, int | str]) -> str:
    """The DEBUG_FIELDS entry for catalog/python/debug_offsets.py (3.13+)."""
    hexv = int(values["PY_VERSION_HEX"])
    v = (hexv >> 24, (hexv >> 16) & 0xFF)
    lines = [f"    {v}: {{"]
    for key, val in values.items():
        if key.startswith("debug."):
            lines.append(f'        "{key[6:]}": {val},')
    lines.append("    },")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--include", required=True, help="folder holding Python.h and internal/")
    ap.add_argument("--source", default="", help="what the headers are (release tag, commit)")
    ap.add_argument(
        "--pyconfig",
        help="folder of the pyconfig.h to use (a build tree's, e.g. a --disable-gil build)",
    )
    ap.add_argument("--json", action="store_true", help="print every measured value as JSON")
    ap.add_argument("--debug", action="store_true", help="print the _Py_DebugOffsets entry")
    args = ap.parse_args()
    values = measure(args.include, pyconfig=args.pyconfig)
    if args.json:
        json.dump(values, sys.stdout, indent=1)
        print()
    elif args.debug:
        print(debug_entry(values))
    else:
        source = args.source or f"CPython {values['PY_VERSION']} headers in {args.include}"
        print(entry(values, source))
    return 0


if __name__ == "__main__":
    sys.exit(main())
