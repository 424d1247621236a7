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
where the checkout lives. They do depend on the compiler and on the system
headers (libbpf-dev, linux-libc-dev): the committed objects are Debian 12's
build (clang 14.0.6), and catalog/toolchains.toml records what each checked
toolchain (Debian 13's clang 19 too) makes of each object, so that --check
answers on either release:

    python3 tools/build_bpf.py --record-toolchain   # this compiler's sha256s -> toolchains.toml
    tools/debian13.sh --build-bpf                    # the one command after a source change:
                                                     # build here, then record Debian 13's

--check says, for each object, whether this machine rebuilds the committed
bytes, or (another compiler) its build matches the sha256 recorded for this
compiler from the same sources; anything else is a MISMATCH.
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
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bpf_toolchains as toolchains  # noqa: E402 - beside this script

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
    # Loader inputs of the kernel tests (program kinds, externs, kfuncs, BTF
    # kinds): committed as built here; the tests also compile each source with
    # the machine's own clang, since clang 14 and 19 emit different BTF.
    Path("tests/data/programs/btf_kinds.bpf.c"),
    Path("tests/data/programs/externs.bpf.c"),
    Path("tests/data/programs/fentry.bpf.c"),
    Path("tests/data/programs/kinds.bpf.c"),
    Path("tests/data/programs/mapinmap.bpf.c"),
    Path("tests/data/programs/task_kfunc.bpf.c"),
    Path("tests/data/programs/taskiter.bpf.c"),
    Path("tests/data/programs/typed_ksym.bpf.c"),
    Path("tests/data/programs/usdt.bpf.c"),
    Path("tests/data/programs/weak_kfunc.bpf.c"),
)
CATALOG = ROOT / "catalog" / "catalog.toml"
TOOLCHAINS = ROOT / "catalog" / "toolchains.toml"


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


@dataclass
class Result:
    """One object as this compiler built it."""

    src: Path
    key: str  # the committed object's path, relative to the root
    out: Path  # where this build wrote it
    sha256: str
    sources: str  # digest of the repository files it was compiled from
    system: set[str]  # the system headers it included


def build(clang: str, source: Path, output: Path, key: str) -> Result:
    depfile = output.with_name(output.name + ".d")
    cmd = clang_command(clang, source, output)
    r = subprocess.run([*cmd, "-MD", "-MF", str(depfile)], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit(f"build_bpf: clang failed on {source}: {' '.join(cmd)}")
    if r.stderr:
        sys.stderr.write(r.stderr)
    deps = toolchains.parse_depfile(depfile.read_text())
    depfile.unlink()
    repo, system = set(), set()
    for d in deps:
        p = Path(d)
        if not p.is_absolute():
            repo.add(d)
        elif p.is_relative_to(ROOT):
            repo.add(str(p.relative_to(ROOT)))
        else:
            system.add(d)
    digest = toolchains.digest_files(ROOT, repo)
    return Result(source, key, output, sha256_file(output), digest, system)


def build_all(clang: str, srcs: list[Path], outdir: Path | None) -> list[Result]:
    """Build every source, in place (outdir None) or into outdir."""
    results = []
    for i, src in enumerate(srcs):
        key = str(src.with_name(object_name(src)))
        if outdir is None:
            out = ROOT / key
        else:
            (outdir / str(i)).mkdir()
            out = outdir / str(i) / object_name(src)
        results.append(build(clang, src, out, key))
    return results


def toolchain_of(version: str, results: list[Result], committed: bool) -> toolchains.Toolchain:
    system = set().union(*(r.system for r in results))
    return toolchains.Toolchain(
        compiler=version,
        headers=toolchains.digest_files(Path("/"), system),
        release=toolchains.os_release(),
        committed=committed,
        objects={r.key: toolchains.Built(r.sha256, r.sources) for r in results},
    )


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
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Which compiler built the committed objects, and what others make of "
        "them: catalog/toolchains.toml (see README.md, 'Approving an object').",
    )
    ap.add_argument("--check", action="store_true", help="rebuild and compare; write nothing")
    ap.add_argument(
        "--record-toolchain",
        action="store_true",
        help="rebuild in a temp dir; record this compiler's sha256s in catalog/toolchains.toml "
        "(objects and catalog untouched)",
    )
    ap.add_argument("--clang", default=os.environ.get("CLANG", "clang"), help="compiler")
    args = ap.parse_args(argv)

    clang = shutil.which(args.clang) or args.clang
    version = clang_version(clang)
    print(f"build_bpf: {version}")
    ref = toolchains.committed(toolchains.load(TOOLCHAINS))
    catalog_srcs = sources()
    srcs = catalog_srcs + side_sources()
    if args.check:
        return check(clang, version, srcs)
    if args.record_toolchain:
        return record_toolchain(clang, version, srcs, ref)
    if ref is not None and ref.compiler != version:
        print(
            f"build_bpf: warning: the committed objects were built with {ref.compiler}; "
            f"{version} makes other bytes (and hashes): they replace them now",
            file=sys.stderr,
        )
    results = build_all(clang, srcs, None)
    hashes: dict[str, str] = {}
    for r in results:
        print(f"build_bpf: {r.key} sha256 {r.sha256}")
        if r.src in catalog_srcs:
            hashes[r.out.name] = r.sha256
    record_hashes(hashes)
    toolchains.record(TOOLCHAINS, toolchain_of(version, results, committed=True))
    print(f"build_bpf: recorded {version} as the committed toolchain in catalog/toolchains.toml")
    return 0


def record_toolchain(
    clang: str, version: str, srcs: list[Path], ref: toolchains.Toolchain | None
) -> int:
    if ref is not None and ref.compiler == version:
        print(
            f"build_bpf: {version} built the committed objects: run python3 tools/build_bpf.py",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="gfxbpf-build-") as tmp:
        results = build_all(clang, srcs, Path(tmp))
    toolchains.record(TOOLCHAINS, toolchain_of(version, results, committed=False))
    print(f"build_bpf: recorded {len(results)} sha256s of {version} in catalog/toolchains.toml")
    return 0


def check(clang: str, version: str, srcs: list[Path]) -> int:
    """Rebuild every object in a temporary directory and judge it: 1 on any mismatch."""
    recorded = catalog_hashes(CATALOG) if CATALOG.exists() else {}
    tcs = toolchains.load(TOOLCHAINS)
    bad: list[str] = []
    counts = {"same": 0, "recorded": 0}
    with tempfile.TemporaryDirectory(prefix="gfxbpf-build-") as tmp:
        results = build_all(clang, srcs, Path(tmp))
        for r in results:
            problem, how = judge(r, version, tcs, recorded)
            if problem:
                bad.append(f"{r.key}: {problem}")
            else:
                counts[how] += 1
                print(f"build_bpf: {r.key} ok")
    for line in bad:
        print(f"build_bpf: MISMATCH {line}", file=sys.stderr)
    print(summary(version, tcs, counts, len(bad)))
    return 1 if bad else 0


def judge(
    r: Result, version: str, tcs: list[toolchains.Toolchain], catalog: dict[str, str]
) -> tuple[str | None, str]:
    """(what is wrong or None, "same" | "recorded") for one rebuilt object."""
    committed = ROOT / r.key
    if not committed.exists():
        return "not built (run python3 tools/build_bpf.py)", ""
    have = sha256_file(committed)
    if catalog.get(committed.name, have) != have and committed.parent == ROOT / PROGRAMS:
        return "catalog.toml sha256 is stale (run python3 tools/build_bpf.py)", ""
    ref = toolchains.committed(tcs)
    ref_entry = ref.objects.get(r.key) if ref else None
    if ref_entry is None or ref_entry.sha256 != have or ref_entry.sources != r.sources:
        who = ref.compiler if ref else "the committed toolchain"
        return f"not what catalog/toolchains.toml records for {who} from these sources", ""
    for t in tcs:  # every toolchain's record must follow the sources
        e = t.objects.get(r.key)
        if e is None or e.sources != r.sources:
            return (
                f"{t.compiler}'s sha256 was recorded from other sources "
                "(run tools/debian13.sh --build-bpf)",
                "",
            )
    if committed.read_bytes() == r.out.read_bytes():
        return None, "same"
    mine = toolchains.find(tcs, version)
    if mine is None:
        return f"differs from a rebuild of {r.src}, and no sha256 is recorded for {version}", ""
    if mine.objects[r.key].sha256 != r.sha256:
        return f"{version}'s build differs from the sha256 recorded for it", ""
    return None, "recorded"


def summary(version: str, tcs: list[toolchains.Toolchain], counts: dict[str, int], bad: int) -> str:
    ref = toolchains.committed(tcs)
    ref_name = f"{ref.compiler} ({ref.release})" if ref else "an unrecorded toolchain"
    lines = [f"build_bpf: the committed objects are the build of {ref_name}"]
    if counts["same"]:
        lines.append(f"build_bpf: {counts['same']} rebuilt byte for byte with {version}")
    if counts["recorded"]:
        lines.append(
            f"build_bpf: {counts['recorded']} built by {version} match the sha256 recorded for "
            "it from the same sources; to check the committed bytes themselves, rebuild with "
            f"{ref.compiler if ref else 'that toolchain'}"
        )
    if bad:
        lines.append(f"build_bpf: {bad} MISMATCH (listed above)")
    return "\n".join(lines)


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
