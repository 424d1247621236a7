"""The externs part of `python -m gfxbpf.bpf inspect`: each extern and how it
resolves on the running kernel (.kconfig values, vmlinux BTF ids; typeless
ksyms are named as kernel addresses, never printed)."""

from __future__ import annotations

from typing import Any

from gfxbpf.bpf.externs.decls import describe as describe_extern
from gfxbpf.bpf.object import ObjectSpec


def describe_externs(spec: ObjectSpec) -> dict[str, Any]:
    """{name: {kind, weak, ... how it resolves}} (an "error" key where it does not)."""
    return {name: describe_extern(e) for name, e in sorted(spec.externs.items())}


def print_externs(externs: dict[str, Any]) -> None:
    if not externs:
        return
    print("externs (as they resolve on this kernel):")
    for name, e in externs.items():
        weak = " __weak" if e["weak"] else ""
        if "error" in e:
            how = f"UNRESOLVED: {e['error']}"
        elif e["kind"] == "kconfig":
            value = "unset (reads 0)" if e["value"] is None else e["value"]
            how = f"@{e['offset']} ({e['size']} bytes) = {value}  from {e['from']}"
        elif not e.get("typed", True):
            how = str(e["resolves_to"])
        else:
            btf_id = e["vmlinux_btf_id"]
            how = f"vmlinux BTF id {btf_id}" if btf_id else "absent (weak: resolves to 0)"
        print(f"  {name}  {e['kind']}{weak}  {how}")
