"""The program catalog: catalog/catalog.toml parsed and validated into dataclasses.

The catalog names each reviewed program, its object in catalog/programs/, the
sha256 of that object, the scopes it may run in, where it attaches, which
.rodata knobs take tracepoint field offsets, and how its maps are shown.
Every problem is found before the catalog is refused, each naming the
catalog file, the program and the key at fault (gfxbpf.tomlcheck.checks).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gfxbpf.bpf.consts import SCOPES
from gfxbpf.bpf.errors import InputError
from gfxbpf.catalog import cuda_api, memory_api
from gfxbpf.catalog.function_tables import TableFunction
from gfxbpf.tomlcheck import checks
from gfxbpf.tomlcheck.checks import Entry, FileProblems, Problems, show, shown

ATTACH_KINDS = (
    "tracepoint",
    "raw_tracepoint",
    "tp_btf",
    "uprobe",
    "uretprobe",
    "usdt",
    "perf_event",
)
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
_USDT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*:[A-Za-z_][A-Za-z0-9_]*$")
_OBJECT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\.bpf\.o$")


class CatalogError(FileProblems, InputError):
    """catalog.toml is malformed or names something that is not there;
    .problems lists every problem found."""


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
    # usdt only: a probe an older build of the library lacks is left out, not an error
    optional: bool = False

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
    # show = "table": the value members gfxbpf-exporter turns into metrics;
    # None: every numeric member (a lookup table lists none)
    metrics: tuple[str, ...] | None = None


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
    # A hidden one-entry u64 array the broker writes with bpf_ktime_get_ns()
    # once attached (offcpu: a wait that began before it counts from then).
    since_map: str | None = None
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
    # memstacks: record one allocation per this many bytes (0, the object's default: all)
    sample_bytes_knob: str | None = None
    # .rodata u32 of a program that walks Python frames (gfx_python.h): the
    # most frames a record holds; such a program has maps py_files and
    # py_layouts, which the broker fills before attaching.
    python_frames_knob: str | None = None
    # .rodata u64 of a program that runs in scope job (gfx_cgroup.h): the
    # cgroup v2 id whose tasks, and its descendants', count (0: every cgroup).
    cgroup_knob: str | None = None

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
            self.cgroup_knob,
            self.sample_bytes_knob,
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
    text = checks.read_text(p, CatalogError, "catalog")
    return parse_catalog(text, directory=p.parent / PROGRAMS_DIR, source=str(p))


def parse_catalog(text: str, *, directory: str | Path, source: str = "catalog.toml") -> Catalog:
    """Validate catalog text; objects must exist in directory. CatalogError
    lists every problem found."""
    data = checks.parse_toml(text, source, CatalogError)
    problems = Problems(source)
    top = problems.entry("top level")
    top.unknown_keys(data, ("program",))
    programs: list[Program] = []
    for i, table in top.tables(data, "program", "program"):
        prog = _parse_program(table, i, Path(directory), problems)
        if prog is None:
            continue
        if prog.name in (p.name for p in programs):
            problems.add(f"[[program]] #{i} {show(prog.name)}", "name", "declared twice")
        programs.append(prog)
    problems.raise_if_any(CatalogError)
    return Catalog(path=Path(source), programs=tuple(programs))


# --- validation (gfxbpf.tomlcheck.checks: every problem, each naming file, entry and field) ---

_PROGRAM_KEYS = (
    "name",
    "object",
    "sha256",
    "description",
    "scopes",
    "uid_knob",
    "pid_knob",
    "children_knob",
    "tree_map",
    "since_map",
    "stack_bytes_knob",
    "min_block_knob",
    "python_frames_knob",
    "cgroup_knob",
    "sample_bytes_knob",
    "attach",
    "field",
    "map",
    "parameter",
    "requires",
    "function_table",
)
_ATTACH_KEYS = ("program", "kind", "target", "variant", "optional")
_FIELD_KEYS = ("knob", "tracepoint", "field", "size_knob", "variant", "optional")
_MAP_KEYS = (
    "name", "visible", "show", "unit", "key_label", "description", "event_type", "metrics",
)  # fmt: skip
_PARAMETER_KEYS = ("name", "type", "required", "description")
_C_IDENT = "a C identifier"


def _ident(at: Entry, table: dict[str, Any], key: str, required: bool = False) -> str | None:
    return at.matching(table, key, _IDENT, _C_IDENT, required)


def _sub_entries(
    at: Entry, table: dict[str, Any], key: str
) -> Iterator[tuple[Entry, dict[str, Any]]]:
    """The [[program.KEY]] tables of a program, each with the Entry its problems go to."""
    for i, sub in at.tables(table, key, f"program.{key}"):
        yield at.problems.entry(f"{at.where} [[program.{key}]] #{i}"), sub


# long: one line per catalog key, in the order the catalog documents them.
def _parse_program(
    entry: dict[str, Any], index: int, directory: Path, problems: Problems
) -> Program | None:
    raw_name = entry.get("name")
    where = f"[[program]] #{index}"
    if isinstance(raw_name, str) and raw_name:
        where += f" {show(raw_name)}"
    at = problems.entry(where)
    at.unknown_keys(entry, _PROGRAM_KEYS)
    name, obj, sha, description = _parse_identity(at, entry, directory)
    scopes = _parse_scopes(at, entry)
    requires = at.string(entry, "requires")
    uid_knob, pid_knob = _ident(at, entry, "uid_knob"), _ident(at, entry, "pid_knob")
    stack_bytes_knob, python_frames_knob, min_block_knob, sample_knob = _copy_knobs(at, entry)
    if "self" in scopes and not (uid_knob or pid_knob):
        at.add("scopes", "scope 'self' needs a uid_knob or pid_knob to filter by")
    cgroup_knob = _ident(at, entry, "cgroup_knob")
    if "job" in scopes and not (uid_knob and cgroup_knob):
        at.add("scopes", "scope 'job' needs a uid_knob and a cgroup_knob to filter by")
    before_attach = len(problems)
    attach = _parse_attach_list(at, entry)
    # Fields are checked against the attach list only when it is complete.
    complete = attach if len(problems) == before_attach else None
    fields = tuple(
        f for sub, t in _sub_entries(at, entry, "field") if (f := _parse_field(sub, t, complete))
    )
    children_knob, tree_map = _parse_tree(at, entry, pid_knob)
    knobs = [k for k in (uid_knob, pid_knob, children_knob, cgroup_knob) if k]
    knobs += [k for k in (stack_bytes_knob, python_frames_knob, min_block_knob, sample_knob) if k]
    knobs += [k for f in fields for k in (f.knob, f.size_knob) if k]
    _refuse_duplicates(at, "field", knobs, "knob {} is assigned more than once")
    maps = tuple(m for sub, t in _sub_entries(at, entry, "map") if (m := _parse_map(sub, t)))
    _refuse_duplicates(at, "map", [m.name for m in maps], "map {} is declared twice")
    since_map = _hidden_maps(at, entry, tree_map, maps)
    params = tuple(
        p for sub, t in _sub_entries(at, entry, "parameter") if (p := _parse_parameter(sub, t))
    )
    _refuse_duplicates(at, "parameter", [p.name for p in params], "parameter {} is declared twice")
    function_table = _parse_function_table(at, entry, attach)
    if not at.ok or None in (name, obj, sha, description):
        return None
    assert name and obj and sha and description
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
        since_map=since_map,
        fields=fields,
        maps=maps,
        parameters=params,
        requires=requires,
        function_table=function_table,
        stack_bytes_knob=stack_bytes_knob,
        min_block_knob=min_block_knob,
        python_frames_knob=python_frames_knob,
        cgroup_knob=cgroup_knob,
        sample_bytes_knob=sample_knob,
    )


def _copy_knobs(at: Entry, entry: dict[str, Any]) -> tuple[str | None, ...]:
    """(stack_bytes_knob, python_frames_knob, min_block_knob, sample_bytes_knob):
    stack-copy programs' knobs."""
    names = ("stack_bytes_knob", "python_frames_knob", "min_block_knob", "sample_bytes_knob")
    return tuple(_ident(at, entry, n) for n in names)


def function_table(name: str) -> tuple[TableFunction, ...]:
    """The function table a catalog entry names (catalog/function_tables.py); KeyError if none."""
    tables = {"cuda": cuda_api.FUNCTIONS, "memory": memory_api.FUNCTIONS}
    return tables[name]


def _parse_tree(
    at: Entry, entry: dict[str, Any], pid_knob: str | None
) -> tuple[str | None, str | None]:
    """(children_knob, tree_map): both or neither, and only beside a pid_knob."""
    knob = _ident(at, entry, "children_knob")
    tree = _ident(at, entry, "tree_map")
    if bool(knob) != bool(tree):
        at.add("children_knob" if tree else "tree_map", "children_knob and tree_map go together")
    elif knob and not pid_knob:
        at.add("children_knob", "following children needs a pid_knob (whose children?)")
    return knob or None, tree or None


def _hidden_maps(
    at: Entry, entry: dict[str, Any], tree_map: str | None, maps: tuple[MapEntry, ...]
) -> str | None:
    """Check the tree map; the since_map, checked too."""
    since_map = _ident(at, entry, "since_map")
    _check_hidden_map(at, "tree_map", tree_map, maps)
    _check_hidden_map(at, "since_map", since_map, maps)
    return since_map


def _check_hidden_map(at: Entry, key: str, name: str | None, maps: tuple[MapEntry, ...]) -> None:
    """The tree and since maps are the broker's bookkeeping: declared, never shown to a client."""
    if name is None:
        return
    m = next((m for m in maps if m.name == name), None)
    if m is None or m.visible:
        at.add(key, f"map {show(name)} must be a [[program.map]] with visible = false")


def _parse_function_table(
    at: Entry, entry: dict[str, Any], attach: tuple[Attach, ...]
) -> str | None:
    name = at.string(entry, "function_table")
    if not name:
        return None
    try:
        function_table(name)
    except KeyError:
        at.add("function_table", f"no function table {show(name)}")
        return None
    if not any(a.kind in ("uprobe", "uretprobe") for a in attach):
        at.add("function_table", "only a program with uprobes takes a function table")
    return name


def _parse_identity(
    at: Entry, entry: dict[str, Any], directory: Path
) -> tuple[str | None, str | None, str | None, str | None]:
    """name, object (which must exist in directory), sha256 and description."""
    name = at.string(entry, "name", True)
    if name is not None and not _NAME.match(name):
        at.add("name", f"{show(name)} must be lowercase letters, digits and _ (max 64)")
        name = None
    obj = at.string(entry, "object", True)
    if obj is not None and not _OBJECT.match(obj):
        at.add("object", f"{show(obj)} must be a file name ending in .bpf.o (no directories)")
        obj = None
    elif obj is not None and not (directory / obj).is_file():
        at.add("object", f"{directory / obj} does not exist (build it: python3 tools/build_bpf.py)")
        obj = None
    sha = at.string(entry, "sha256", True)
    if sha is not None and not _SHA256.match(sha):
        at.add("sha256", f"{show(sha)} is not 64 lowercase hex digits")
        sha = None
    description = at.string(entry, "description", True)
    return name, obj, sha, description


def _parse_scopes(at: Entry, entry: dict[str, Any]) -> tuple[str, ...]:
    if not at.present(entry, "scopes", True):
        return ()
    scopes = entry["scopes"]
    if not isinstance(scopes, list) or not scopes:
        at.add("scopes", f"expected a non-empty array, got {shown(scopes)}")
        return ()
    bad = [s for s in scopes if s not in SCOPES]
    if bad:
        at.add("scopes", f"{show(bad[0])} is not one of {', '.join(SCOPES)}")
    elif len(set(scopes)) != len(scopes):
        at.add("scopes", "lists a scope twice")
    return tuple(s for s in scopes if s in SCOPES)


def _parse_attach_list(at: Entry, entry: dict[str, Any]) -> tuple[Attach, ...]:
    """The [[program.attach]] entries: at least one, none repeated."""
    attach: list[Attach] = []
    for sub, t in _sub_entries(at, entry, "attach"):
        a = _parse_attach(sub, t)
        if a is not None and (a.program, a.target, a.variant) in (
            (b.program, b.target, b.variant) for b in attach
        ):
            sub.add(None, f"duplicates an earlier entry for {show(a.program)}")
        elif a is not None:
            attach.append(a)
    if not attach and at.ok:
        at.add("attach", "a program needs at least one [[program.attach]]")
    return tuple(attach)


def _refuse_duplicates(at: Entry, key: str, names: list[str], problem: str) -> None:
    """A problem for each name that appears twice (problem formats it)."""
    for dup in sorted({n for n in names if names.count(n) > 1}):
        at.add(key, problem.format(show(dup)))


def _parse_attach(at: Entry, t: dict[str, Any]) -> Attach | None:
    at.unknown_keys(t, _ATTACH_KEYS)
    program = _ident(at, t, "program", True)
    kind = at.choice(t, "kind", ATTACH_KINDS, True)
    target = at.string(t, "target")
    variant = at.string(t, "variant")
    optional = at.boolean(t, "optional", False)
    if kind is not None:
        _check_attach_target(at, kind, target)
    if optional and kind != "usdt":
        at.add("optional", "only a usdt probe may be optional (one a library may lack)")
    if not at.ok:
        return None
    assert program is not None and kind is not None
    return Attach(
        program=program, kind=kind, target=target, variant=variant, optional=bool(optional)
    )


def _check_attach_target(at: Entry, kind: str, target: str | None) -> None:
    """Tracepoints name their target in the catalog; probes get theirs at attach."""
    if kind == "tracepoint":
        if target is None:
            at.add("target", "missing (a tracepoint needs 'system/event')")
        elif not _TRACEPOINT.match(target):
            at.add("target", f"{show(target)} is not 'system/event'")
    elif kind == "raw_tracepoint":
        if target is None:
            at.add("target", "missing (a raw tracepoint needs its name)")
        elif not _IDENT.match(target):
            at.add("target", f"{show(target)} is not a raw tracepoint name")
    elif kind == "tp_btf":  # needs vmlinux BTF, not tracefs
        if target is None or not _IDENT.match(target):
            at.add("target", "missing or not a tracepoint name (tp_btf/<name>)")
    elif kind == "usdt":  # the probe is fixed; the library comes with the request
        if target is None or not _USDT.match(target):
            at.add("target", "missing or not a USDT probe ('provider:name')")
    elif target is not None:
        at.add("target", f"a {kind} takes no target in the catalog (chosen at attach time)")


def _parse_field(at: Entry, t: dict[str, Any], attach: tuple[Attach, ...] | None) -> Field | None:
    at.unknown_keys(t, _FIELD_KEYS)
    knob = _ident(at, t, "knob", True)
    tracepoint = at.matching(t, "tracepoint", _TRACEPOINT, "'system/event'", True)
    fname = _ident(at, t, "field", True)
    size_knob = _ident(at, t, "size_knob")
    variant = at.string(t, "variant")
    optional = at.boolean(t, "optional", False)
    if tracepoint is not None and attach is not None:
        variant = _field_variant(at, tracepoint, variant, attach)
    if not at.ok:
        return None
    assert knob is not None and tracepoint is not None and fname is not None
    return Field(
        knob=knob,
        tracepoint=tracepoint,
        field=fname,
        size_knob=size_knob,
        variant=variant,
        optional=bool(optional),
    )


def _field_variant(
    at: Entry, tracepoint: str, variant: str | None, attach: tuple[Attach, ...]
) -> str | None:
    """A knob is filled from a tracepoint this program attaches to, in the same variant."""
    variants = {a.variant for a in attach if a.kind == "tracepoint" and a.target == tracepoint}
    if not variants:
        at.add("tracepoint", f"{show(tracepoint)} is not an attach target of this program")
    elif variant is not None:
        if variant not in variants:
            known = ", ".join(show(v) for v in sorted(variants, key=str))
            at.add(
                "variant",
                f"{show(variant)} does not attach {show(tracepoint)} (its variants: {known})",
            )
    elif len(variants) > 1:
        at.add("variant", f"{show(tracepoint)} is in several variants: name one")
    else:
        variant = next(iter(variants))
    return variant


def _parse_map(at: Entry, t: dict[str, Any]) -> MapEntry | None:
    at.unknown_keys(t, _MAP_KEYS)
    name = _ident(at, t, "name", True)
    visible = at.boolean(t, "visible", None)
    # A client names a visible map; a hidden one may keep a longer name that
    # a library header fixes (libbpf's __bpf_usdt_specs), cut by the loader.
    if name is not None and len(name) > MAP_NAME_MAX and visible is not False:
        at.add("name", f"{show(name)} is longer than {MAP_NAME_MAX} characters")
    shows = at.choice(t, "show", SHOWS, bool(visible))
    unit = at.choice(t, "unit", UNITS, bool(visible) and shows in ("counter", "log2_histogram"))
    key_label = at.string(t, "key_label")
    description = at.string(t, "description", True)
    event_type = _ident(at, t, "event_type", shows == "events")
    if event_type is not None and shows != "events":
        at.add("event_type", "only a map with show = 'events' has an event_type")
    metrics = _metrics(at, t, shows)
    if not at.ok:
        return None
    assert name is not None and visible is not None and description is not None
    return MapEntry(
        name=name,
        visible=visible,
        description=description,
        show=shows,
        unit=unit,
        key_label=key_label,
        event_type=event_type,
        metrics=metrics,
    )


def _metrics(at: Entry, t: dict[str, Any], shows: str | None) -> tuple[str, ...] | None:
    """A table's `metrics`: C identifiers (its value's members), each once."""
    if "metrics" not in t:
        return None
    if shows != "table":
        at.add("metrics", "only a map with show = 'table' lists its metrics")
        return None
    names = at.strings(t, "metrics")
    if names is None:
        return None
    for n in names:
        if not _IDENT.match(n):
            at.add("metrics", f"{show(n)} is not {_C_IDENT} (a member of the map's value)")
    if len(set(names)) != len(names):
        at.add("metrics", "a member is listed twice")
    return names


def _parse_parameter(at: Entry, t: dict[str, Any]) -> Parameter | None:
    at.unknown_keys(t, _PARAMETER_KEYS)
    name = _ident(at, t, "name", True)
    ptype = at.choice(t, "type", PARAMETER_TYPES, True)
    required = at.boolean(t, "required", False)
    description = at.string(t, "description", True)
    if not at.ok:
        return None
    assert name is not None and ptype is not None and description is not None
    return Parameter(name=name, type=ptype, required=bool(required), description=description)
