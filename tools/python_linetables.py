#!/usr/bin/env python3
"""Record real CPython line tables, and the lines CPython itself gives for
each instruction, for the line-table tests of releases other than the host's.

Run it WITH the interpreter whose tables are wanted (3.9 or newer); it prints
one JSON object for that release:

    python3.13 tools/python_linetables.py > /tmp/313.json

tests/data/python_linetables.json holds one such object per release, with
the interpreter each came from. For every code object of a fixed sample
module it records the raw table (co_lnotab on 3.9, co_linetable on 3.10+),
co_firstlineno, and per 2-byte code unit the line the interpreter's own C
code assigns: co_positions() on 3.11+, co_lines() on 3.10, and on 3.9 the
line starts of dis.findlinestarts (CPython's reading of co_lnotab).
"""

import dis
import json
import platform
import sys

# The sample: plain and nested functions, a method (qualname), a loop, a
# multi-line expression, a jump of more than 127 lines (multi-step entries),
# non-ASCII names (1- and 2-byte strings); the file name has a 4-byte one.
SAMPLE = (
    "def plain(a):\n"
    "    b = a + 1\n"
    "    return b * 2\n"
    "\n"
    "class Holder:\n"
    "    def method(self, xs):\n"
    "        total = 0\n"
    "        for x in xs:\n"
    "            if x % 2:\n"
    "                total += x\n"
    "            else:\n"
    "                total -= (x +\n"
    "                          1)\n"
    "        return total\n"
    "\n"
    "def far(a):\n"
    "    a += 1\n" + "\n" * 300 + "    a *= 3\n"
    "    return [i for i in range(a)\n"
    "            if i > 2]\n"
    "\n"
    "def naïve_日本(n):\n"
    "    def inner():\n"
    "        return n\n"
    "    try:\n"
    "        return inner()\n"
    "    except ValueError:\n"
    "        return None\n"
)
FILENAME = "/srv/app/sample_\U0001d518.py"
# The release this runs on (it runs on 3.9+, unlike the project itself).
RUNNING = tuple(sys.version_info[:2])


def _codes(code):
    yield code
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            yield from _codes(const)


def _unit_lines(code):
    units = len(code.co_code) // 2
    if RUNNING >= (3, 11):
        return [pos[0] for pos in code.co_positions()]
    lines = [None] * units
    if RUNNING >= (3, 10):
        for start, end, line in code.co_lines():
            for i in range(start // 2, end // 2):
                lines[i] = line
        return lines
    starts = dict(dis.findlinestarts(code))
    line = code.co_firstlineno
    for i in range(units):
        line = starts.get(i * 2, line)
        lines[i] = line
    return lines


def main():
    module = compile(SAMPLE, FILENAME, "exec")
    out = {
        "version": list(sys.version_info[:3]),
        "interpreter": sys.version.split()[0] + " " + platform.python_implementation(),
        "filename": FILENAME,
        "codes": [],
    }
    for code in _codes(module):
        table = code.co_lnotab if RUNNING < (3, 10) else code.co_linetable
        out["codes"].append(
            {
                "name": code.co_name,
                "qualname": getattr(code, "co_qualname", code.co_name),
                "firstlineno": code.co_firstlineno,
                "table": table.hex(),
                "lines": _unit_lines(code),
            }
        )
    json.dump(out, sys.stdout, ensure_ascii=False)
    print()


if __name__ == "__main__":
    main()
