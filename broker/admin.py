"""gfxbpf-admin: the administrator's review tools.

gfxbpf-admin approve NAME --users alice,bob --groups video --scope self
    prints a ready [[program]] policy entry with the catalog object's sha256
    (after checking the object against the catalog and the static audit);
gfxbpf-admin audit OBJECT
    prints what the broker's static audit sees: program types, helpers,
    maps, sizes, and the verdict (exit status 1 when it refuses).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from gfxbpf.bpf.consts import SCOPES
from gfxbpf.bpf.object import MAX_OBJECT_SIZE, object_name
from gfxbpf.broker.review import checks
from gfxbpf.catalog.entries import Catalog, CatalogError, CatalogKeyError, Program, load_catalog
from gfxbpf.catalog.objects import check_object
from gfxbpf.catalog.stack_copies import (
    APPROVED_STACK_BYTES,
    DEEP_STACK_BYTES,
    LARGEST_STACK_BYTES,
    MAX_STACK_BYTES,
    most_stack_bytes,
)

PROG = "gfxbpf-admin"


def _split(values: list[str] | None) -> list[str | int]:
    out: list[str | int] = []
    for v in values or []:
        for item in v.split(","):
            item = item.strip()
            if item:
                out.append(int(item) if item.isdigit() else item)
    return out


def _toml(value: object) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(value)


def _catalog(path: str | None) -> Catalog:
    if path is not None:
        p = Path(path)
        return load_catalog(p / "catalog.toml" if p.is_dir() else p)
    return load_catalog()


def approve(args: argparse.Namespace) -> int:
    catalog = _catalog(args.catalog)
    entry = catalog.get(args.name)
    data = (entry.directory / entry.object).read_bytes()
    problems = check_object(entry, data)
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.sha256:
        problems.insert(
            0,
            f"{entry.directory / entry.object} has sha256 {digest}, the catalog says "
            f"{entry.sha256}",
        )
    report = checks.audit_bytes(data, entry.object.split(".", 1)[0])
    problems += report.problems
    if problems:
        for p in problems:
            print(f"{PROG}: {p}", file=sys.stderr)
        print(f"{PROG}: not approving {args.name!r}", file=sys.stderr)
        return 1
    users, groups = _split(args.users), _split(args.groups)
    if not users and not groups:
        print(
            f"{PROG}: name --users and/or --groups (the entry would admit nobody)", file=sys.stderr
        )
        return 2
    scopes = args.scope or [entry.scopes[0]]
    bad = [s for s in scopes if s not in entry.scopes]
    if bad:
        print(
            f"{PROG}: program {args.name!r} supports scope {', '.join(entry.scopes)}, "
            f"not {', '.join(bad)}",
            file=sys.stderr,
        )
        return 2
    if args.max_stack_bytes is not None and not entry.stack_bytes_knob:
        print(f"{PROG}: program {args.name!r} copies no stack (--max-stack-bytes)", file=sys.stderr)
        return 2
    if (args.max_stack_bytes or 0) > (most := most_stack_bytes(entry.name)):
        print(
            f"{PROG}: program {args.name!r} copies at most {most} bytes of stack "
            f"(--max-stack-bytes {args.max_stack_bytes}): give {most} or less",
            file=sys.stderr,
        )
        return 2
    print("\n".join(_entry_lines(args, entry, report, users, groups, scopes)))
    return 0


def _entry_lines(
    args: argparse.Namespace,
    entry: Program,
    report: checks.AuditReport,
    users: list[str | int],
    groups: list[str | int],
    scopes: list[str],
) -> list[str]:
    """The policy entry, with what was reviewed as comments above it."""
    lines = [
        f"# {entry.name}: {entry.description}",
        f"# reviewed object {entry.object}; helpers: "
        + ", ".join(sorted({h for p in report.programs for h in p.helpers})),
        "[[program]]",
        f"name = {_toml(entry.name)}",
        f"sha256 = {_toml(entry.sha256)}",
    ]
    if users:
        lines.append(f"users = {_toml(users)}")
    if groups:
        lines.append(f"groups = {_toml(groups)}")
    lines.append(f"scope = {_toml(scopes if len(scopes) > 1 else scopes[0])}")
    libraries = _split(args.libraries)
    if libraries:
        lines.append(f"libraries = {_toml(libraries)}")
    functions = _split(args.functions)
    if functions:
        lines.append(f"functions = {_toml(functions)}")
    if args.max_frequency is not None:
        lines.append(f"max_frequency = {args.max_frequency}")
    copy = args.max_stack_bytes or APPROVED_STACK_BYTES.get(entry.name)
    if copy is not None:
        lines.append(f"max_stack_bytes = {copy}")
    if args.allow_no_btf:
        lines.append("allow_no_btf = true")
    return lines


def audit_cmd(args: argparse.Namespace) -> int:
    path = Path(args.object)
    with open(path, "rb") as f:
        data = f.read(MAX_OBJECT_SIZE + 1)
    report = checks.audit_bytes(data, object_name(str(path)))
    print(f"object {path}")
    print(report.text())
    return 0 if report.ok else 1


def _stack_bytes(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) <= LARGEST_STACK_BYTES:
        raise argparse.ArgumentTypeError(
            f"not a stack copy size (1-{LARGEST_STACK_BYTES}): {text!r}"
        )
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Review tools for the gfxbpf broker.")
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser(
        "approve", help="print a policy entry for a catalog program (with its sha256)"
    )
    a.add_argument("name", help="catalog program name")
    a.add_argument("--users", action="append", help="user names or uids, comma separated")
    a.add_argument("--groups", action="append", help="group names or gids, comma separated")
    a.add_argument(
        "--scope",
        action="append",
        choices=SCOPES,
        help="self, system or job (repeat): job is self within one Slurm job",
    )
    a.add_argument("--libraries", action="append", help="uprobe target globs (ucalls)")
    a.add_argument("--functions", action="append", help="uprobe symbol globs")
    a.add_argument(
        "--max-frequency",
        type=int,
        metavar="HZ",
        help="highest sampling rate of a perf_event program (profile)",
    )
    a.add_argument(
        "--max-stack-bytes",
        type=_stack_bytes,
        metavar="N",
        help=f"user stack bytes a stack copy takes unless the client asks for less (stackcopy, "
        f"ustackcopy, memstacks, offcpu: 1-{MAX_STACK_BYTES}; cudakernels: 1-{DEEP_STACK_BYTES}); "
        f"default: {MAX_STACK_BYTES} for stackcopy, ustackcopy and memstacks (deep C++ stacks "
        f"such as PyTorch's, whole), {DEEP_STACK_BYTES} for cudakernels (launches from under "
        "cuBLASLt), the object's 8192 for offcpu",
    )
    a.add_argument(
        "--allow-no-btf",
        action="store_true",
        help="let the object load without its BTF if the kernel refuses it (maps lose "
        "their types); by default such an attach fails with the kernel's BTF log",
    )
    a.add_argument("--catalog", metavar="DIR", help="catalog directory (default: installed)")
    a.set_defaults(func=approve)
    b = sub.add_parser("audit", help="show what the static audit sees in an object")
    b.add_argument("object", help="a BPF ELF object (.bpf.o)")
    b.set_defaults(func=audit_cmd)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rc: int = args.func(args)
        return rc
    except (CatalogError, CatalogKeyError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{PROG}: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
