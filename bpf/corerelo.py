"""CO-RE on an object: core/apply.py given an ObjectSpec's BTF, records and
programs (what the loader relocates), and the relocations as plain data and
text, for `python -m gfxbpf.bpf inspect`.

Each relocation shows its kind, the local type and access, and how it
resolves against a target: the running kernel's BTF by default, or a BTF
file given with --target-btf (a raw BTF blob, or an ELF object whose .BTF
stands in for a kernel).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from gfxbpf.bpf.core import apply
from gfxbpf.bpf.core.apply import CoreRecord, CoreResult
from gfxbpf.bpf.core.relo import CoreError
from gfxbpf.bpf.core.target import Target
from gfxbpf.bpf.kernel.vmlinux import SYSFS_BTF, kernel_target
from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.bpf.specs import ObjectError


def has_core_relos(spec: ObjectSpec, only: Collection[str] | None = None) -> bool:
    """Whether the object (or the programs in only, and any subprogram) has CO-RE relocations."""
    if spec.btf_ext is None:
        return False
    return apply.has_core_relos(spec.btf_ext.core_relos, list(spec.programs.values()), only)


def relocate(
    spec: ObjectSpec,
    target: Target,
    strict: bool = True,
    also: Collection[str] = (),
    only: Collection[str] | None = None,
) -> CoreResult:
    """Every CO-RE relocation of spec's programs resolved against target and
    patched (core/apply.py's relocate, which says what strict, also and only mean)."""
    if spec.btf is None or spec.btf_ext is None:
        return CoreResult()
    progs = list(spec.programs.values())
    return apply.relocate(spec.btf, spec.btf_ext.core_relos, progs, target, strict, also, only)


def load_target(path: str | None) -> tuple[Target, str]:
    """The target to resolve against, and how to name it. CoreError if unreadable."""
    if path is None:
        return kernel_target(), f"running kernel ({SYSFS_BTF})"
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
