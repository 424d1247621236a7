#!/usr/bin/env python3
"""Build the project's BPF objects reproducibly and record their sha256.

    python3 tools/build_bpf.py           # build every *.bpf.o, update catalog.toml
    python3 tools/build_bpf.py --check   # rebuild into a temp dir, compare, write nothing

The catalog's objects are catalog/programs/*.bpf.o; their hashes go into
catalog/catalog.toml and deploy/policy.example.toml. The side objects (bench/'s
own programs and the tests' audit objects) are built and checked the same
way, beside their sources, with no hash recorded anywhere.

Each object is compiled from the repository root with a relative source path
and `-fdebug-compilation-dir=.`, so no absolute path of the checkout enters
the debug info and the bytes (hence the approved sha256) do not depend on
where the checkout lives. They do depend on the compiler: the committed
objects were built with Debian clang 14.0.6.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = Path("catalog/programs")  # relative: it is baked into the debug info
# Not in the catalog, never attached for a client; committed all the same.
SIDE_SOURCES = (
    # The broker's own iterator (bpf/mapids.py): packaged, not in the catalog.
    Path("bpf/internal/mapids.bpf.c"),
    Path("bench/bench.bpf.c"),
    Path("bench/readcost.bpf.c"),
    Path("tests/data/objects/probe_write_user.bpf.c"),
    Path("tests/data/objects/trace_printk.bpf.c"),
    Path("tests/data/objects/ksym_address.bpf.c"),
    # CO-RE: stand-in kernels (only their BTF is used), a program with every
    # relocation kind for the offline tests, one against the real kernel.
    Path("tests/data/core/target_new.bpf.c"),
    Path("tests/data/core/target_old.bpf.c"),
    Path("tests/data/core/target_exec.bpf.c"),
    Path("tests/data/core/core_kinds.bpf.c"),
    Path("tests/data/core/core_kernel.bpf.c"),
)
CATALOG = ROOT / "catalog" / "catalog.toml"
EXPECTED_CLANG = "Debian clang version 14.0.6"


def clang_command(clang: str, source: Path, output: Path) -> list[str]:
    return [
        clang,
        "-O2",
        "-g",
        "-target",
        "bpf",
        "-D__TARGET_ARCH_x86",
        "-I/usr/include/x86_64-linux-gnu",
        f"-I{PROGRAMS}",  # gfxbpf.h, for sources outside catalog/programs
        # No working directory in DW_AT_comp_dir / BTF file names ...
        "-fdebug-compilation-dir=.",
        # ... and whatever else might carry the checkout path (macros, __FILE__).
        f"-ffile-prefix-map={ROOT}=.",
        "-c",
        str(source),
        "-o",
        str(output),
    ]


def clang_version(clang: str) -> str:
    try:
        out = subprocess.run([clang, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(
            f"build_bpf: cannot run {clang!r} ({e}); install clang (Debian: clang)"
        ) from e
    return out.stdout.splitlines()[0].strip() if out.stdout else "unknown"


def sources() -> list[Path]:
    found = sorted((ROOT / PROGRAMS).glob("*.bpf.c"))
    if not found:
        raise SystemExit(f"build_bpf: no *.bpf.c in {ROOT / PROGRAMS}")
    return [PROGRAMS / p.name for p in found]


def side_sources() -> list[Path]:
    # A partial copy of the tree (the build tests make one) may lack them.
    return [src for src in SIDE_SOURCES if (ROOT / src).exists()]


def object_name(source: Path) -> str:
    return source.name[: -len(".c")] + ".o"


def build(clang: str, source: Path, output: Path) -> None:
    cmd = clang_command(clang, source, output)
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit(f"build_bpf: clang failed on {source}: {' '.join(cmd)}")
    if r.stderr:
        sys.stderr.write(r.stderr)


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


_HEADER = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.\s]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r'^(\s*)(object|sha256)(\s*=\s*)"([^"]*)"(.*)$')


def rewrite_sha256(text: str, hashes: dict[str, str]) -> tuple[str, list[str]]:
    """Replace the sha256 value of each [[program]] whose object is in hashes.

    Only sha256 lines change (comments and layout stay); a program without a
    sha256 line gets one after its object line. Returns the new text and the
    objects that no [[program]] names.
    """
    lines = text.splitlines(keepends=True)
    blocks: list[tuple[int, int]] = []  # [start, end) of each [[program]] table
    start: int | None = None
    for i, line in enumerate(lines):
        m = _HEADER.match(line)
        if not m:
            continue
        if start is not None:
            blocks.append((start, i))
            start = None
        if line.strip().startswith("[[") and m.group(1).strip() == "program":
            start = i
    if start is not None:
        blocks.append((start, len(lines)))

    seen: set[str] = set()
    inserts: list[tuple[int, str]] = []
    for begin, end in blocks:
        obj = obj_line = sha_line = None
        for i in range(begin + 1, end):
            m = _KEY.match(lines[i].rstrip("\r\n"))
            if m and m.group(2) == "object":
                obj, obj_line = m.group(4), i
            elif m and m.group(2) == "sha256":
                sha_line = i
        if obj is None or obj not in hashes:
            continue
        seen.add(obj)
        if sha_line is not None:
            m = _KEY.match(lines[sha_line].rstrip("\r\n"))
            assert m is not None
            eol = lines[sha_line][len(lines[sha_line].rstrip("\r\n")) :]
            lines[sha_line] = f'{m.group(1)}sha256{m.group(3)}"{hashes[obj]}"{m.group(5)}{eol}'
        else:
            assert obj_line is not None
            indent = _KEY.match(lines[obj_line]).group(1)  # type: ignore[union-attr]
            inserts.append((obj_line + 1, f'{indent}sha256 = "{hashes[obj]}"\n'))
    for at, line in sorted(inserts, reverse=True):
        lines.insert(at, line)
    return "".join(lines), sorted(set(hashes) - seen)


def catalog_hashes(path: Path) -> dict[str, str]:
    """object file name -> sha256 recorded in the catalog."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    return {
        p["object"]: p.get("sha256", "")
        for p in data.get("program", [])
        if isinstance(p, dict) and "object" in p
    }


EXAMPLE_POLICY = ROOT / "deploy" / "policy.example.toml"
_POLICY_LINE = re.compile(r'^(\s*)(name|sha256)(\s*=\s*)"([^"]*)"(.*)$')


def rewrite_policy_hashes(text: str, by_name: dict[str, str]) -> str:
    """Set the sha256 of each [[program]] in a policy to its catalog object's hash.

    The example policy approves the shipped objects; a rebuild updates it too.
    """
    out, name = [], None
    for line in text.splitlines(keepends=True):
        m = _POLICY_LINE.match(line.rstrip("\n"))
        if line.strip() == "[[program]]":
            name = None
        elif m and m.group(2) == "name":
            name = m.group(4)
        elif m and m.group(2) == "sha256" and name in by_name:
            eol = "\n" if line.endswith("\n") else ""
            line = f'{m.group(1)}sha256{m.group(3)}"{by_name[name]}"{m.group(5)}{eol}'
        out.append(line)
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="rebuild and compare; write nothing")
    ap.add_argument("--clang", default=os.environ.get("CLANG", "clang"), help="compiler")
    args = ap.parse_args(argv)

    clang = shutil.which(args.clang) or args.clang
    version = clang_version(clang)
    print(f"build_bpf: {version}")
    if not version.startswith(EXPECTED_CLANG):
        print(
            f"build_bpf: warning: the committed objects were built with {EXPECTED_CLANG}; "
            "another compiler produces different bytes (and hashes)",
            file=sys.stderr,
        )

    catalog_srcs = sources()
    srcs = catalog_srcs + side_sources()
    if args.check:
        return check(clang, srcs)
    hashes: dict[str, str] = {}
    for src in srcs:
        out = ROOT / src.with_name(object_name(src))
        build(clang, src, out)
        digest = sha256_file(out)
        print(f"build_bpf: {out.relative_to(ROOT)} sha256 {digest}")
        if src in catalog_srcs:
            hashes[out.name] = digest
    record_hashes(hashes)
    return 0


def check(clang: str, srcs: list[Path]) -> int:
    """Rebuild every object in a temporary directory and compare: 1 on any mismatch."""
    bad: list[str] = []
    recorded = catalog_hashes(CATALOG) if CATALOG.exists() else {}
    with tempfile.TemporaryDirectory(prefix="gfxbpf-build-") as tmp:
        for src in srcs:
            name = object_name(src)
            out = Path(tmp) / name
            build(clang, src, out)
            committed = ROOT / src.with_name(name)
            if not committed.exists():
                bad.append(f"{name}: not built (run python3 tools/build_bpf.py)")
            elif committed.read_bytes() != out.read_bytes():
                bad.append(f"{name}: differs from a rebuild of {src}")
            elif name in recorded and recorded[name] != sha256_file(committed):
                bad.append(f"{name}: catalog.toml sha256 is stale")
            else:
                print(f"build_bpf: {src.with_name(name)} ok")
    for line in bad:
        print(f"build_bpf: MISMATCH {line}", file=sys.stderr)
    return 1 if bad else 0


def record_hashes(hashes: dict[str, str]) -> None:
    """Write the catalog objects' sha256 into catalog.toml and the example policy."""
    if not CATALOG.exists():
        print(f"build_bpf: warning: {CATALOG} does not exist; no hashes recorded", file=sys.stderr)
        return
    text = CATALOG.read_text()
    new, missing = rewrite_sha256(text, hashes)
    if new != text:
        CATALOG.write_text(new)
        print(f"build_bpf: updated sha256 lines in {CATALOG.relative_to(ROOT)}")
    for name in missing:
        print(f"build_bpf: warning: {name} has no [[program]] in catalog.toml", file=sys.stderr)
    by_name = {p["name"]: p["sha256"] for p in tomllib.loads(new)["program"]}
    if EXAMPLE_POLICY.exists():
        old = EXAMPLE_POLICY.read_text()
        updated = rewrite_policy_hashes(old, by_name)
        if updated != old:
            EXAMPLE_POLICY.write_text(updated)
            print(f"build_bpf: updated sha256 lines in {EXAMPLE_POLICY.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
