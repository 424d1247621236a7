"""The one checked reader of catalog objects: an entry's object read from
catalog/programs/ (bounded, hashed against the catalog's sha256), and the
checks of an object against its entry (maps, attach points, knobs) that
gfxbpf-admin runs before approving it."""

from __future__ import annotations

import hashlib
from pathlib import Path

from gfxbpf.bpf.object import MAX_OBJECT_SIZE, ObjectSpec, object_name
from gfxbpf.bpf.specs import ObjectError
from gfxbpf.catalog.entries import CatalogError, Program


def object_path(entry: Program) -> Path:
    """Path of the entry's object file."""
    return entry.directory / entry.object


class ObjectUnreadable(CatalogError):
    """The catalog names an object file that cannot be read."""


class ObjectChanged(CatalogError):
    """An object's bytes no longer hash to the catalog's sha256."""


def read_object(entry: Program) -> bytes:
    """The object's bytes, read once (at most MAX_OBJECT_SIZE + 1 of them) and
    checked against the catalog's sha256: the one checked reader of catalog
    objects, for the broker, the tools and the tests."""
    path = object_path(entry)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_OBJECT_SIZE + 1)
    except OSError as e:
        raise ObjectUnreadable(
            str(path), [f"program {entry.name!r}: cannot read object {path}: {e.strerror or e}"]
        ) from e
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.sha256:
        raise ObjectChanged(
            str(path),
            [
                f"program {entry.name!r}: {path} has sha256 {digest}, but the catalog says "
                f"{entry.sha256}; the object changed since it was reviewed (rebuild it with "
                "python3 tools/build_bpf.py and re-approve it)"
            ],
        )
    return data


def check_object(entry: Program, data: bytes | None = None) -> list[str]:
    """Compare the catalog entry with its object; return the problems found.

    Checks that every map in the object's .maps is declared (and every
    declared map exists), that each attach program is a function in a section
    of the matching kind and target, and that the knobs are exactly the
    object's .rodata variables.
    """
    if data is None:
        data = object_path(entry).read_bytes()
    where = f"program {entry.name!r} ({entry.object})"
    try:
        spec = ObjectSpec.parse(data, object_name(entry.object))
    except ObjectError as e:
        return [f"{where}: not a readable ELF object: {e}"]
    return (
        _map_problems(entry, spec, where)
        + _attach_problems(entry, spec, where)
        + _knob_problems(entry, spec, where)
    )


def _map_problems(entry: Program, spec: ObjectSpec, where: str) -> list[str]:
    """Maps in the object's .maps and in the catalog, each side against the other."""
    in_object = {m.real_name for m in spec.maps.values() if not m.is_data}
    declared = {m.name for m in entry.maps}
    return [
        f"{where}: map {name!r} is in the object but not in the catalog"
        for name in sorted(in_object - declared)
    ] + [
        f"{where}: catalog map {name!r} is not in the object's .maps"
        for name in sorted(declared - in_object)
    ]


def _attach_problems(entry: Program, spec: ObjectSpec, where: str) -> list[str]:
    """Each attach entry against the kind and target of its function's section."""
    problems: list[str] = []
    for a in entry.attach:
        prog = spec.programs.get(a.program)
        if prog is None:
            problems.append(f"{where}: attach program {a.program!r} is not a function")
            continue
        # A program that does not autoload ("?" section) attaches as nothing.
        kind = prog.attach_kind if prog.autoload else None
        target = prog.attach_target if prog.autoload else None
        if kind != a.kind:
            problems.append(
                f"{where}: {a.program!r} is in section {prog.section!r}, not a {a.kind}"
            )
        elif target is not None and a.target is not None and target != a.target:
            problems.append(
                f"{where}: {a.program!r} is in section {prog.section!r} "
                f"but the catalog says {a.target!r}"
            )
    return problems


def _knob_problems(entry: Program, spec: ObjectSpec, where: str) -> list[str]:
    """The declared knobs against the object's .rodata variables, both ways."""
    rodata_map = spec.maps.get(".rodata")
    rodata = set(rodata_map.variables) if rodata_map is not None else set()
    problems = [
        f"{where}: knob {knob!r} is not a .rodata variable"
        for knob in entry.knobs
        if knob not in rodata
    ]
    # Every load-time setting is reviewed in the catalog, none left implicit.
    problems += [
        f"{where}: .rodata variable {name!r} is not a declared knob"
        for name in sorted(rodata - set(entry.knobs))
    ]
    return problems
