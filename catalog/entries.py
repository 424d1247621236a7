"""The program catalog: catalog/catalog.toml parsed and validated into dataclasses.

The catalog names each reviewed program, its object in catalog/programs/, the
sha256 of that object, the scopes it may run in, where it attaches, which
.rodata knobs take tracepoint field offsets, and how its maps are shown.
Every error names the catalog file, the program and the key at fault.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gfxbpf.bpf.consts import SCOPES
from gfxbpf.bpf.errors import InputError
from gfxbpf.bpf.object import MAX_OBJECT_SIZE, ObjectError, ObjectSpec, object_name
from gfxbpf.catalog import cuda_api
from gfxbpf.catalog.function_tables import TableFunction

ATTACH_KINDS = ("tracepoint", "raw_tracepoint", "tp_btf", "uprobe", "uretprobe", "perf_event")
SHOWS = ("counter", "log2_histogram", "events", "table")
UNITS = ("count", "bytes", "ns")
PARAMETER_TYPES = ("int", "str", "list[str]")
# What an optional field's knob holds on a kernel whose event lacks the field
# (GFX_ABSENT in catalog/programs/gfxbpf.h).
FIELD_ABSENT = 0xFFFFFFFF
# The kernel keeps 15 characters of a map name (BPF_OBJ_NAME_LEN 16 with NUL).
MAP_NAME_MAX = 15

DEFAULT_PATH = Path(__file__).resolve().parent / "catalog.toml"
PROGRAMS_DIR = "programs"

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_TRACEPOINT = re.compile(r"^[A-Za-z0-9_]+/[A-Za-z0-9_]+$")
_OBJECT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\.bpf\.o$")


class CatalogError(ValueError, InputError):
    """catalog.toml is malformed or names something that is not there."""


class CatalogKeyError(KeyError, InputError):
    """A program (or a program's map) the catalog does not have."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown name"


@dataclass(frozen=True)
class Attach:
    program: str  # BPF function name in the object
    kind: str  # one of ATTACH_KINDS
    target: str | None = None  # "system/event", (raw/tp_btf) tracepoint name; None: at attach
    variant: str | None = None

    @property
    def tracepoint(self) -> tuple[str, str]:
        """(category, event) of a tracepoint target."""
        if self.kind != "tracepoint" or self.target is None:
            raise ValueError(f"attach {self.program!r} is a {self.kind}, not a tracepoint")
        category, event = self.target.split("/", 1)
        return category, event


@dataclass(frozen=True)
class Field:
    knob: str  # .rodata u32 that takes the field's byte offset
    tracepoint: str  # "system/event"
    field: str
    size_knob: str | None = None  # .rodata u32 that takes the field's size
    variant: str | None = None  # inherited from the tracepoint's attach entry when omitted
    # A field some releases lack: then the knob takes FIELD_ABSENT (and the
    # size knob 0) and the program does without it, instead of not running.
    optional: bool = False


@dataclass(frozen=True)
class MapEntry:
    name: str
    visible: bool  # False: broker-only, never handed to a client
    description: str
    show: str | None = None  # one of SHOWS; required when visible
    unit: str | None = None  # one of UNITS
    key_label: str | None = None
    event_type: str | None = None  # BTF struct of ring-buffer records (show = "events")
    # A broker-only map charged to the caller's map budget all the same (visible
    # maps always are): one whose size a client's request makes it allocate.
    charged: bool = False


@dataclass(frozen=True)
class Parameter:
    name: str
    type: str  # one of PARAMETER_TYPES
    required: bool
    description: str


@dataclass(frozen=True)
class Program:
    name: str
    object: str  # file name in the programs directory
    sha256: str
    description: str
    scopes: tuple[str, ...]
    attach: tuple[Attach, ...]
    directory: Path  # where object lives
    uid_knob: str | None = None
    pid_knob: str | None = None
    # Process trees (gfx_tree.h): the knob that turns on following the pid's
    # descendants, and the hidden map of their tgids that the broker seeds.
    children_knob: str | None = None
    tree_map: str | None = None
    fields: tuple[Field, ...] = ()
    maps: tuple[MapEntry, ...] = ()
    parameters: tuple[Parameter, ...] = ()
    # What the host needs for this program (hardware, driver), in words.
    requires: str | None = None
    # Uprobe functions from a table (catalog/function_tables.py), not from the client.
    function_table: str | None = None
    # .rodata u32: how many user stack bytes a stack copy takes (the broker
    # lowers it to the policy entry's max_stack_bytes).
    stack_bytes_knob: str | None = None
    # .rodata u32 (offcpu): waits shorter than this many microseconds are dropped
    # in the kernel (the broker writes the request's, never below the policy's floor).
    min_block_knob: str | None = None
    # .rodata u32 of a program that walks Python frames (gfx_python.h): the
    # most frames a record holds; such a program has maps py_files and
    # py_layouts, which the broker fills before attaching.
    python_frames_knob: str | None = None

    def map(self, name: str) -> MapEntry:
        for m in self.maps:
            if m.name == name:
                return m
        known = ", ".join(m.name for m in self.maps)
        raise CatalogKeyError(f"program {self.name!r} has no map {name!r} (maps: {known})")

    @property
    def visible_maps(self) -> tuple[MapEntry, ...]:
        return tuple(m for m in self.maps if m.visible)

    @property
    def variants(self) -> tuple[str, ...]:
        """Variant names in file order (the order the broker tries them)."""
        seen: dict[str, None] = {}
        for a in self.attach:
            if a.variant is not None:
                seen.setdefault(a.variant, None)
        return tuple(seen)

    def attach_for(self, variant: str | None) -> tuple[Attach, ...]:
        """Entries without a variant plus those of variant."""
        return tuple(a for a in self.attach if a.variant is None or a.variant == variant)

    def fields_for(self, variant: str | None) -> tuple[Field, ...]:
        return tuple(f for f in self.fields if f.variant is None or f.variant == variant)

    @property
    def knobs(self) -> tuple[str, ...]:
        """Every .rodata knob the broker may write."""
        knobs = (
            self.uid_knob,
            self.pid_knob,
            self.children_knob,
            self.stack_bytes_knob,
            self.python_frames_knob,
            self.min_block_knob,
        )
        names = [k for k in knobs if k]
        for f in self.fields:
            names.append(f.knob)
            if f.size_knob:
                names.append(f.size_knob)
        return tuple(names)


@dataclass(frozen=True)
class Catalog:
    path: Path
    programs: tuple[Program, ...] = ()

    def get(self, name: str) -> Program:
        for p in self.programs:
            if p.name == name:
                return p
        raise CatalogKeyError(
            f"no program {name!r} in catalog {self.path}; known: {', '.join(self.names())}"
        )

    def names(self) -> list[str]:
        return [p.name for p in self.programs]

    def __iter__(self) -> Iterator[Program]:
        return iter(self.programs)

    def __len__(self) -> int:
        return len(self.programs)

    def __contains__(self, name: object) -> bool:
        return any(p.name == name for p in self.programs)


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Parse and validate a catalog (default: the catalog.toml next to this module).

    Objects are looked up in the `programs` directory beside the catalog file.
    """
    p = Path(path) if path is not None else DEFAULT_PATH
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise CatalogError(f"cannot read catalog {p}: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise CatalogError(f"catalog {p} is not UTF-8: {e}") from e
    return parse_catalog(text, directory=p.parent / PROGRAMS_DIR, source=str(p))


def parse_catalog(text: str, *, directory: str | Path, source: str = "catalog.toml") -> Catalog:
    """Validate catalog text; objects must exist in directory."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise CatalogError(f"{source}: not valid TOML: {e}") from e
    _check_keys(data, {"program"}, f"{source}: top level")
    raw = data.get("program", [])
    if not isinstance(raw, list) or not all(isinstance(x, dict) for x in raw):
        raise CatalogError(f"{source}: 'program' must be an array of tables ([[program]])")
    programs: list[Program] = []
    names: set[str] = set()
    for i, entry in enumerate(raw):
        prog = _parse_program(entry, i, Path(directory), source)
        if prog.name in names:
            raise CatalogError(f"{source}: program {prog.name!r} is declared twice")
        names.add(prog.name)
        programs.append(prog)
    return Catalog(path=Path(source), programs=tuple(programs))


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
            f"program {entry.name!r}: cannot read object {path}: {e.strerror or e}"
        ) from e
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.sha256:
        raise ObjectChanged(
            f"program {entry.name!r}: {path} has sha256 {digest}, but the catalog says "
            f"{entry.sha256}; the object changed since it was reviewed (rebuild it with "
            "python3 tools/build_bpf.py and re-approve it)"
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


# --- validation helpers ---------------------------------------------------


def _check_keys(table: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise CatalogError(
            f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})"
        )


class _Ctx:
    """Error-message context for one [[program]] entry."""

    def __init__(self, source: str, label: str) -> None:
        self.source = source
        self.label = label

    def fail(self, key: str, problem: str) -> CatalogError:
        return CatalogError(f"{self.source}: program {self.label}: {key}: {problem}")

    def check_keys(self, table: dict[str, Any], allowed: set[str], where: str) -> None:
        unknown = sorted(set(table) - allowed)
        if unknown:
            raise self.fail(
                where + unknown[0], f"unknown key (allowed: {', '.join(sorted(allowed))})"
            )

    def get_str(
        self, table: dict[str, Any], key: str, where: str, required: bool = True
    ) -> str | None:
        label = f"{where}{key}"
        if key not in table:
            if required:
                raise self.fail(label, "missing")
            return None
        v = table[key]
        if not isinstance(v, str) or not v.strip():
            raise self.fail(label, f"must be a non-empty string, got {v!r}")
        return v

    def get_ident(
        self, table: dict[str, Any], key: str, where: str, required: bool = True
    ) -> str | None:
        v = self.get_str(table, key, where, required)
        if v is not None and not _IDENT.match(v):
            raise self.fail(f"{where}{key}", f"{v!r} is not a C identifier")
        return v

    def get_bool(self, table: dict[str, Any], key: str, where: str, default: bool | None) -> bool:
        if key not in table:
            if default is None:
                raise self.fail(f"{where}{key}", "missing")
            return default
        v = table[key]
        if not isinstance(v, bool):
            raise self.fail(f"{where}{key}", f"must be true or false, got {v!r}")
        return v

    def get_choice(
        self, table: dict[str, Any], key: str, where: str, choices: tuple[str, ...], required: bool
    ) -> str | None:
        v = self.get_str(table, key, where, required)
        if v is not None and v not in choices:
            raise self.fail(f"{where}{key}", f"{v!r} is not one of {', '.join(choices)}")
        return v

    def get_tables(self, table: dict[str, Any], key: str) -> list[dict[str, Any]]:
        v = table.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
            raise self.fail(key, f"must be an array of tables ([[program.{key}]])")
        return v


_PROGRAM_KEYS = {
    "name",
    "object",
    "sha256",
    "description",
    "scopes",
    "uid_knob",
    "pid_knob",
    "children_knob",
    "tree_map",
    "stack_bytes_knob",
    "min_block_knob",
    "python_frames_knob",
    "attach",
    "field",
    "map",
    "parameter",
    "requires",
    "function_table",
}
_ATTACH_KEYS = {"program", "kind", "target", "variant"}
_FIELD_KEYS = {"knob", "tracepoint", "field", "size_knob", "variant", "optional"}
_MAP_KEYS = {
    "name", "visible", "show", "unit", "key_label", "description", "event_type", "charged",
}  # fmt: skip
_PARAMETER_KEYS = {"name", "type", "required", "description"}


def _parse_program(entry: dict[str, Any], index: int, directory: Path, source: str) -> Program:
    raw_name = entry.get("name")
    label = repr(raw_name) if isinstance(raw_name, str) else f"#{index + 1}"
    c = _Ctx(source, label)
    unknown = sorted(set(entry) - _PROGRAM_KEYS)
    if unknown:
        raise c.fail(unknown[0], f"unknown key (allowed: {', '.join(sorted(_PROGRAM_KEYS))})")
    name, obj, sha, description = _parse_identity(c, entry, directory)
    scopes = _parse_scopes(c, entry)
    requires = c.get_str(entry, "requires", "", required=False)
    uid_knob = c.get_ident(entry, "uid_knob", "", required=False)
    pid_knob = c.get_ident(entry, "pid_knob", "", required=False)
    stack_bytes_knob, python_frames_knob = _copy_knobs(c, entry)
    min_block_knob = c.get_ident(entry, "min_block_knob", "", required=False)
    if "self" in scopes and not (uid_knob or pid_knob):
        raise c.fail("scopes", "scope 'self' needs a uid_knob or pid_knob to filter by")
    attach = _parse_attach_list(c, entry)
    fields = tuple(
        _parse_field(c, t, i, attach) for i, t in enumerate(c.get_tables(entry, "field"))
    )
    children_knob, tree_map = _parse_tree(c, entry, pid_knob)
    knobs = [k for k in (uid_knob, pid_knob, children_knob) if k]
    knobs += [k for k in (stack_bytes_knob, python_frames_knob, min_block_knob) if k]
    knobs += [k for f in fields for k in (f.knob, f.size_knob) if k]
    _refuse_duplicates(c, "field", knobs, "knob {!r} is assigned more than once")
    maps = tuple(_parse_map(c, t, i) for i, t in enumerate(c.get_tables(entry, "map")))
    _refuse_duplicates(c, "map", [m.name for m in maps], "map {!r} is declared twice")
    _check_tree_map(c, tree_map, maps)
    params = tuple(
        _parse_parameter(c, t, i) for i, t in enumerate(c.get_tables(entry, "parameter"))
    )
    _refuse_duplicates(c, "parameter", [p.name for p in params], "parameter {!r} is declared twice")
    function_table = _parse_function_table(c, entry, attach)
    return Program(
        name=name,
        object=obj,
        sha256=sha,
        description=description,
        scopes=scopes,
        attach=attach,
        directory=directory,
        uid_knob=uid_knob,
        pid_knob=pid_knob,
        children_knob=children_knob,
        tree_map=tree_map,
        fields=fields,
        maps=maps,
        parameters=params,
        requires=requires,
        function_table=function_table,
        stack_bytes_knob=stack_bytes_knob,
        min_block_knob=min_block_knob,
        python_frames_knob=python_frames_knob,
    )


def _copy_knobs(c: _Ctx, entry: dict[str, Any]) -> tuple[str | None, str | None]:
    """(stack_bytes_knob, python_frames_knob) of a stack-copy program."""
    stack_bytes = c.get_ident(entry, "stack_bytes_knob", "", required=False)
    python_frames = c.get_ident(entry, "python_frames_knob", "", required=False)
    return stack_bytes, python_frames


def function_table(name: str) -> tuple[TableFunction, ...]:
    """The function table a catalog entry names (catalog/function_tables.py); KeyError if none."""
    tables = {"cuda": cuda_api.FUNCTIONS}
    return tables[name]


def _parse_tree(
    c: _Ctx, entry: dict[str, Any], pid_knob: str | None
) -> tuple[str | None, str | None]:
    """(children_knob, tree_map): both or neither, and only beside a pid_knob."""
    knob = c.get_ident(entry, "children_knob", "", required=False)
    tree = c.get_ident(entry, "tree_map", "", required=False)
    if bool(knob) != bool(tree):
        raise c.fail(
            "children_knob" if tree else "tree_map", "children_knob and tree_map go together"
        )
    if knob and not pid_knob:
        raise c.fail("children_knob", "following children needs a pid_knob (whose children?)")
    return knob or None, tree or None


def _check_tree_map(c: _Ctx, tree_map: str | None, maps: tuple[MapEntry, ...]) -> None:
    """The tree is the broker's bookkeeping: declared, and never shown to a client."""
    if tree_map is None:
        return
    m = next((m for m in maps if m.name == tree_map), None)
    if m is None or m.visible:
        raise c.fail("tree_map", f"map {tree_map!r} must be a [[program.map]] with visible = false")


def _parse_function_table(c: _Ctx, entry: dict[str, Any], attach: tuple[Attach, ...]) -> str | None:
    name = c.get_str(entry, "function_table", "", required=False)
    if not name:
        return None
    try:
        function_table(name)
    except KeyError:
        raise c.fail("function_table", f"no function table {name!r}") from None
    if not any(a.kind in ("uprobe", "uretprobe") for a in attach):
        raise c.fail("function_table", "only a program with uprobes takes a function table")
    return name


def _parse_identity(c: _Ctx, entry: dict[str, Any], directory: Path) -> tuple[str, str, str, str]:
    """name, object (which must exist in directory), sha256 and description."""
    name = c.get_str(entry, "name", "")
    assert name is not None
    if not _NAME.match(name):
        raise c.fail("name", f"{name!r} must be lowercase letters, digits and _ (max 64)")
    obj = c.get_str(entry, "object", "")
    assert obj is not None
    if not _OBJECT.match(obj):
        raise c.fail("object", f"{obj!r} must be a file name ending in .bpf.o (no directories)")
    if not (directory / obj).is_file():
        raise c.fail(
            "object", f"{directory / obj} does not exist (build it: python3 tools/build_bpf.py)"
        )
    sha = c.get_str(entry, "sha256", "")
    assert sha is not None
    if not _SHA256.match(sha):
        raise c.fail("sha256", f"{sha!r} is not 64 lowercase hex digits")
    description = c.get_str(entry, "description", "")
    assert description is not None
    return name, obj, sha, description


def _parse_scopes(c: _Ctx, entry: dict[str, Any]) -> tuple[str, ...]:
    scopes = entry.get("scopes")
    if scopes is None:
        raise c.fail("scopes", "missing")
    if not isinstance(scopes, list) or not scopes:
        raise c.fail("scopes", f"must be a non-empty list, got {scopes!r}")
    for s in scopes:
        if s not in SCOPES:
            raise c.fail("scopes", f"{s!r} is not one of {', '.join(SCOPES)}")
    if len(set(scopes)) != len(scopes):
        raise c.fail("scopes", "lists a scope twice")
    return tuple(scopes)


def _parse_attach_list(c: _Ctx, entry: dict[str, Any]) -> tuple[Attach, ...]:
    """The [[program.attach]] entries: at least one, none repeated."""
    attach = tuple(_parse_attach(c, t, i) for i, t in enumerate(c.get_tables(entry, "attach")))
    if not attach:
        raise c.fail("attach", "a program needs at least one [[program.attach]]")
    seen: set[tuple[str, str | None, str | None]] = set()
    for i, a in enumerate(attach):
        key = (a.program, a.target, a.variant)
        if key in seen:
            raise c.fail(f"attach[{i}]", f"duplicates an earlier entry for {a.program!r}")
        seen.add(key)
    return attach


def _refuse_duplicates(c: _Ctx, key: str, names: list[str], problem: str) -> None:
    """Fail on the alphabetically first name that appears twice (problem formats it)."""
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise c.fail(key, problem.format(dup[0]))


def _parse_attach(c: _Ctx, t: dict[str, Any], i: int) -> Attach:
    where = f"attach[{i}]."
    c.check_keys(t, _ATTACH_KEYS, where)
    program = c.get_ident(t, "program", where)
    kind = c.get_choice(t, "kind", where, ATTACH_KINDS, required=True)
    target = c.get_str(t, "target", where, required=False)
    variant = c.get_str(t, "variant", where, required=False)
    assert program is not None and kind is not None
    if kind == "tracepoint":
        if target is None:
            raise c.fail(where + "target", "missing (a tracepoint needs 'system/event')")
        if not _TRACEPOINT.match(target):
            raise c.fail(where + "target", f"{target!r} is not 'system/event'")
    elif kind == "raw_tracepoint":
        if target is None:
            raise c.fail(where + "target", "missing (a raw tracepoint needs its name)")
        if not _IDENT.match(target):
            raise c.fail(where + "target", f"{target!r} is not a raw tracepoint name")
    elif kind == "tp_btf":  # needs vmlinux BTF, not tracefs
        if target is None or not _IDENT.match(target):
            raise c.fail(where + "target", "missing or not a tracepoint name (tp_btf/<name>)")
    elif target is not None:
        raise c.fail(
            where + "target", f"a {kind} takes no target in the catalog (chosen at attach time)"
        )
    return Attach(program=program, kind=kind, target=target, variant=variant)


def _parse_field(c: _Ctx, t: dict[str, Any], i: int, attach: tuple[Attach, ...]) -> Field:
    where = f"field[{i}]."
    c.check_keys(t, _FIELD_KEYS, where)
    knob = c.get_ident(t, "knob", where)
    tracepoint = c.get_str(t, "tracepoint", where)
    fname = c.get_ident(t, "field", where)
    size_knob = c.get_ident(t, "size_knob", where, required=False)
    variant = c.get_str(t, "variant", where, required=False)
    optional = c.get_bool(t, "optional", where, default=False)
    assert knob is not None and tracepoint is not None and fname is not None
    if not _TRACEPOINT.match(tracepoint):
        raise c.fail(where + "tracepoint", f"{tracepoint!r} is not 'system/event'")
    # A knob is filled from a tracepoint this program attaches to, in the same variant.
    variants = {a.variant for a in attach if a.kind == "tracepoint" and a.target == tracepoint}
    if not variants:
        raise c.fail(
            where + "tracepoint", f"{tracepoint!r} is not an attach target of this program"
        )
    if variant is not None:
        if variant not in variants:
            shown = ", ".join(repr(v) for v in sorted(variants, key=str))
            raise c.fail(
                where + "variant",
                f"{variant!r} does not attach {tracepoint!r} (its variants: {shown})",
            )
    elif len(variants) > 1:
        raise c.fail(where + "variant", f"{tracepoint!r} is in several variants: name one")
    else:
        variant = next(iter(variants))
    return Field(
        knob=knob,
        tracepoint=tracepoint,
        field=fname,
        size_knob=size_knob,
        variant=variant,
        optional=optional,
    )


def _parse_map(c: _Ctx, t: dict[str, Any], i: int) -> MapEntry:
    where = f"map[{i}]."
    c.check_keys(t, _MAP_KEYS, where)
    name = c.get_ident(t, "name", where)
    assert name is not None
    if len(name) > MAP_NAME_MAX:
        raise c.fail(where + "name", f"{name!r} is longer than {MAP_NAME_MAX} characters")
    visible = c.get_bool(t, "visible", where, default=None)
    show = c.get_choice(t, "show", where, SHOWS, required=visible)
    unit = c.get_choice(
        t, "unit", where, UNITS, required=show in ("counter", "log2_histogram") and visible
    )
    key_label = c.get_str(t, "key_label", where, required=False)
    description = c.get_str(t, "description", where)
    event_type = c.get_ident(t, "event_type", where, required=show == "events")
    if event_type is not None and show != "events":
        raise c.fail(where + "event_type", "only a map with show = 'events' has an event_type")
    assert description is not None
    charged = bool(c.get_bool(t, "charged", where, default=False))
    if charged and visible:
        raise c.fail(where + "charged", "a visible map is always charged: say it of hidden maps")
    return MapEntry(
        name=name,
        visible=visible,
        description=description,
        show=show,
        unit=unit,
        key_label=key_label,
        event_type=event_type,
        charged=charged,
    )


def _parse_parameter(c: _Ctx, t: dict[str, Any], i: int) -> Parameter:
    where = f"parameter[{i}]."
    c.check_keys(t, _PARAMETER_KEYS, where)
    name = c.get_ident(t, "name", where)
    ptype = c.get_choice(t, "type", where, PARAMETER_TYPES, required=True)
    required = c.get_bool(t, "required", where, default=False)
    description = c.get_str(t, "description", where)
    assert name is not None and ptype is not None and description is not None
    return Parameter(name=name, type=ptype, required=required, description=description)
