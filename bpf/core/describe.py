"""CO-RE relocations of an object as plain data and text, for `python -m gfxbpf.bpf inspect`.

Each relocation shows its kind, the local type and access, and how it
resolves against a target: the running kernel's BTF by default, or a BTF
file given with --target-btf (a raw BTF blob, or an ELF object whose .BTF
stands in for a kernel).
"""

from __future__ import annotations

from typing import Any

from gfxbpf.bpf.core.apply import CoreRecord, has_core_relos, relocate
from gfxbpf.bpf.core.relo import CoreError
from gfxbpf.bpf.core.target import SYSFS_BTF, Target
from gfxbpf.bpf.object import ObjectError, ObjectSpec


def load_target(path: str | None) -> tuple[Target, str]:
    """The target to resolve against, and how to name it. CoreError if unreadable."""
    if path is None:
        return Target.kernel(), f"running kernel ({SYSFS_BTF})"
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CoreError(f"cannot read target BTF {path}: {e.strerror}") from None
    if data[:4] == b"\x7fELF":
        try:
            data = ObjectSpec.parse(data, "target").btf_bytes
        except ObjectError as e:
            raise CoreError(f"target {path}: {e}") from None
        if not data:
            raise CoreError(f"target {path} is an ELF object without a .BTF section")
    try:
        return Target.from_blobs(data), path
    except ValueError as e:
        raise CoreError(f"target {path} is not BTF: {e}") from None


def describe_core(spec: ObjectSpec, target_path: str | None = None) -> dict[str, Any] | None:
    """{"target": ..., "relocations": [...]}, or None for an object without CO-RE."""
    if not has_core_relos(spec):
        return None
    try:
        target, name = load_target(target_path)
    except CoreError as e:
        return {"target": None, "error": str(e), "relocations": []}
    try:
        records = relocate(spec, target, strict=False).records
    except CoreError as e:
        return {"target": name, "error": str(e), "relocations": []}
    return {"target": name, "relocations": [_record(r) for r in records]}


def _record(r: CoreRecord) -> dict[str, Any]:
    d: dict[str, Any] = {
        "program": r.program,
        "insn": r.insn,
        "kind": r.kind_name,
        "local_type_id": r.type_id,
        "access": r.access,
        "local": r.local,
    }
    res = r.result
    if r.error is not None:
        d["error"] = r.error
    elif res is not None and res.poison:
        d["poisoned"] = res.why
    elif res is not None:
        d["value"] = res.new_val
        d["local_value"] = res.orig_val
        if res.target is not None:
            d["target_btf"] = res.target_btf
            d["target_type_id"] = res.target.root_type_id
            d["target"] = res.target.describe()
    return d


def print_core(d: dict[str, Any]) -> None:
    print(f"CO-RE relocations, resolved against {d['target'] or 'nothing'}:")
    if d.get("error"):
        print(f"  cannot resolve: {d['error']}")
    for r in d["relocations"]:
        head = f"  {r['program']} insn {r['insn']}: {r['kind']} {r['local']} ({r['access']})"
        if "error" in r:
            print(f"{head} -> error: {r['error']}")
        elif "poisoned" in r:
            print(f"{head} -> poisoned: {r['poisoned']}")
        elif "target" in r:
            where = f"{r['target_btf']}[{r['target_type_id']}] {r['target']}"
            print(f"{head} -> {where} = {r['value']}")
        elif r["kind"] == "local_type_id":
            print(f"{head} -> the object's own type id = {r['value']}")
        else:
            print(f"{head} -> not in the target = {r['value']}")
