"""python -m gfxbpf.bpf: inspect or load a BPF object, for people who debug objects.

inspect OBJECT [--json] [--disasm]   programs, maps, global data, relocations, helpers,
        [--target-btf FILE]          CO-RE relocations and how they resolve on this kernel
                                     (or against FILE: raw BTF, or an object's .BTF);
                                     externs and how they resolve on this kernel
load OBJECT                          load it, print {"programs": {...}, "maps": {...}}
                                     with kernel ids, keep it loaded until stdin closes;
                                     fails if the kernel refuses its BTF (--allow-no-btf:
                                     loads without it, with a warning on stderr)
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from gfxbpf.bpf import consts as C
from gfxbpf.bpf.asm import analyze, disasm
from gfxbpf.bpf.corerelo import describe_core, print_core
from gfxbpf.bpf.externs.report import describe_externs, print_externs
from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.bpf.specs import ObjectError

EXIT_OK, EXIT_BAD_OBJECT, EXIT_LOAD_FAILED, EXIT_USAGE = 0, 1, 2, 64


def _type_name(enum: type[C.IntEnum], value: int) -> str:
    try:
        return enum(value).name.lower()
    except ValueError:
        return str(value)


def describe(spec: ObjectSpec, with_disasm: bool = False) -> dict[str, Any]:
    """Everything `inspect` prints, as plain data."""
    progs: dict[str, Any] = {}
    for p in spec.programs.values():
        entry: dict[str, Any] = {
            "section": p.section,
            "kind": p.attach_kind,
            "target": p.attach_target,
            "attach_btf": p.attach_btf_name,  # tp_btf, fentry, iter: vmlinux type of the target
            "insns": p.insn_count,
            "relocations": [
                {"insn": r.insn_index, "kind": r.kind, "symbol": r.symbol, "map": r.map_name}
                for r in p.relocations
            ],
        }
        if not p.is_subprog:
            entry["type"] = _type_name(C.ProgType, p.prog_type)
            linked = spec.link_program(p.name)
            facts = analyze(bytes(linked.insns))
            entry["linked_insns"] = facts.insn_count
            entry["subprograms"] = linked.subprogs
            entry["helpers"] = facts.helpers
            entry["kfunc_calls"] = len(facts.kfunc_calls)
            if with_disasm:
                entry["disasm"] = disasm(bytes(linked.insns))
        progs[p.name] = entry
    maps: dict[str, Any] = {}
    for m in spec.maps.values():
        maps[m.real_name] = {
            "kernel_name": m.name,
            "type": _type_name(C.MapType, m.map_type),
            "key_size": m.key_size,
            "value_size": m.value_size,
            "max_entries": m.max_entries,
            "flags": m.flags,
            "key_type": spec.btf.type_str(m.key_type_id) if spec.btf and m.key_type_id else None,
            "value_type": (
                spec.btf.type_str(m.value_type_id) if spec.btf and m.value_type_id else None
            ),
        }
        if m.is_data and m.real_name != ".kconfig":  # .kconfig: filled at load, see externs
            maps[m.real_name]["variables"] = {
                v.name: {"offset": v.offset, "size": v.size, "value": _value(spec, v.name)}
                for v in m.variables.values()
            }
    return {
        "name": spec.name,
        "sha256": spec.sha256,
        "size": spec.size,
        "license": spec.license,
        "btf": spec.btf is not None,
        "programs": progs,
        "maps": maps,
        "externs": describe_externs(spec),
    }


def _value(spec: ObjectSpec, name: str) -> int | str:
    v = spec.get_variable(name)
    return v if isinstance(v, int) else v.hex()


def _print_text(d: dict[str, Any]) -> None:
    print(f"object {d['name']}  sha256 {d['sha256']}  {d['size']} bytes  license {d['license']}")
    print("programs:")
    for name, p in d["programs"].items():
        if p["kind"] == "subprog":
            print(f"  {name}  (subprogram in .text, {p['insns']} insns)")
            continue
        print(f"  {name}  {p['type']}  section {p['section']}  {p['linked_insns']} insns")
        if p["subprograms"]:
            print(f"    calls: {', '.join(p['subprograms'])}")
        print(f"    helpers: {', '.join(p['helpers']) or '-'}")
        for r in p["relocations"]:
            target = f" -> map {r['map']}" if r["map"] else ""
            print(f"    reloc insn {r['insn']}: {r['kind']} {r['symbol']}{target}")
        for line in p.get("disasm", []):
            print(f"      {line}")
    print("maps:")
    for name, m in d["maps"].items():
        types = ""
        if m["key_type"] or m["value_type"]:
            types = f"  {m['key_type'] or '-'} -> {m['value_type'] or '-'}"
        print(
            f"  {name} ({m['kernel_name']})  {m['type']}  key {m['key_size']}  value "
            f"{m['value_size']}  max {m['max_entries']}  flags {m['flags']:#x}{types}"
        )
        for vname, v in m.get("variables", {}).items():
            print(f"    {vname} @{v['offset']} ({v['size']} bytes) = {v['value']}")
    print_externs(d["externs"])


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m gfxbpf.bpf",
        description="Inspect or load a clang-built BPF object with gfxbpf's loader.",
        epilog=f"exit codes: {EXIT_OK} ok, {EXIT_BAD_OBJECT} bad or unsupported object, "
        f"{EXIT_LOAD_FAILED} the kernel refused it (verifier log on stderr), {EXIT_USAGE} usage",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    ins = sub.add_parser(
        "inspect",
        help="print programs, maps, global data, relocations, helpers, CO-RE relocations "
        "and externs (.kconfig, __ksym, kfuncs) with how they resolve on this kernel",
    )
    ins.add_argument("object")
    ins.add_argument("--json", action="store_true", help="print JSON")
    ins.add_argument("--disasm", action="store_true", help="also disassemble each program")
    ins.add_argument(
        "--target-btf",
        metavar="FILE",
        help="resolve CO-RE relocations against FILE (raw BTF such as /sys/kernel/btf/vmlinux "
        "of another host, or an ELF object's .BTF) instead of the running kernel",
    )
    ld = sub.add_parser(
        "load",
        help="load it and print kernel ids as one JSON line; unload when stdin closes",
    )
    ld.add_argument("object")
    ld.add_argument(
        "--allow-no-btf",
        action="store_true",
        help="if the kernel refuses the object's BTF, load without it (maps lose their "
        "types, subprograms their names) instead of failing",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return EXIT_USAGE if e.code else EXIT_OK

    try:
        spec = ObjectSpec.from_file(args.object)
    except OSError as e:
        print(f"error: cannot read {args.object}: {e.strerror}", file=sys.stderr)
        return EXIT_BAD_OBJECT
    except ObjectError as e:
        print(f"error: {args.object}: {e}", file=sys.stderr)
        return EXIT_BAD_OBJECT

    if args.cmd == "inspect":
        return _inspect(
            spec, args.object, as_json=args.json, with_disasm=args.disasm, btf=args.target_btf
        )
    return _load(spec, args.allow_no_btf)


def _inspect(
    spec: ObjectSpec, path: str, *, as_json: bool, with_disasm: bool, btf: str | None = None
) -> int:
    try:
        d = describe(spec, with_disasm)
    except ObjectError as e:
        print(f"error: {path}: {e}", file=sys.stderr)
        return EXIT_BAD_OBJECT
    core = describe_core(spec, btf)
    if core is not None:
        d["core"] = core
    if as_json:
        json.dump(d, sys.stdout, indent=2)
        print()
    else:
        _print_text(d)
        if core is not None:
            print_core(core)
    return EXIT_OK


def _load(spec: ObjectSpec, allow_no_btf: bool) -> int:
    from gfxbpf.bpf.loader import LoadError, load  # needs bpf(2): only for `load`
    from gfxbpf.bpf.syscall import map_info

    # The loader's warnings (the kernel refused the object's BTF...) go to stderr.
    logging.basicConfig(level=logging.WARNING, format="warning: %(message)s")
    try:
        obj = load(spec, allow_no_btf=allow_no_btf)
    except (LoadError, ObjectError) as e:
        print(f"error: {e}", file=sys.stderr)
        log = getattr(e, "log", None)
        if log:
            print("kernel log:\n" + log, file=sys.stderr)
        return EXIT_LOAD_FAILED
    except PermissionError as e:
        print(f"error: {e}: loading BPF needs CAP_BPF and CAP_PERFMON (or root)", file=sys.stderr)
        return EXIT_LOAD_FAILED
    with obj:
        out = {
            "programs": {n: p.id for n, p in obj.programs.items()},
            "maps": {m.name: map_info(m.fileno()).id for m in obj.maps.values()},
        }
        print(json.dumps(out), flush=True)
        try:
            while sys.stdin.read(65536):
                pass
        except KeyboardInterrupt:
            pass
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
