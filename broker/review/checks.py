"""Static audit of a BPF object, before any syscall.

The broker loads only objects whose sha256 the policy approves; the audit is
the second gate: even an approved object must not be able to write user
memory, send signals, change return values, spill into the global trace
pipe, or call kernel functions. It runs on the LINKED instructions of each
program (subprograms appended, as they will be loaded), so a forbidden call
hidden in a .text subprogram is seen too.

Checked: program kinds, kfuncs and __ksym externs (one table,
table.py), helper calls (an allowlist), map types, sizes
(instructions per program, programs and maps per object, total map memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gfxbpf.bpf import asm
from gfxbpf.bpf import consts as C
from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.bpf.specs import ObjectError, ProgramSpec
from gfxbpf.broker.access import budget
from gfxbpf.broker.review.table import extern_problem, map_type_problem, program_kind_problem

# Helpers a reviewed tracing program may call, by group. Anything else is
# refused, so a new kernel helper is denied until someone reviews it here.
ALLOWED_HELPERS = frozenset(
    {
        # Map access: the program's own maps (fds resolved at load time).
        "map_lookup_elem",
        "map_update_elem",
        "map_delete_elem",
        "map_lookup_percpu_elem",
        # Time and randomness.
        "ktime_get_ns",
        "ktime_get_boot_ns",
        "ktime_get_coarse_ns",
        "ktime_get_tai_ns",
        "jiffies64",
        "get_prandom_u32",
        # Who is running: ids and names only (no task pointers).
        "get_current_pid_tgid",
        "get_current_uid_gid",
        "get_current_comm",
        "get_current_cgroup_id",
        # scope `job`: the task's cgroup ancestors (ids only), gfx_cgroup.h
        "get_current_ancestor_cgroup_id",
        "get_smp_processor_id",
        # The current task as a typed (BTF) pointer, and its user registers:
        # scope `self` checks the task's uids and dumpable flag at every event
        # (gfx_task.h) and a stack copy starts at the user sp. A typed pointer
        # reads no more than probe_read_kernel already can; keeping pointers
        # out of visible maps stays part of reviewing a program. The untyped
        # get_current_task (a plain u64) stays refused.
        "get_current_task_btf",
        "task_pt_regs",
        "get_numa_node_id",
        # Reading memory. Explicit address spaces only: the legacy
        # probe_read/probe_read_str guess kernel vs user and are refused.
        "probe_read_kernel",
        "probe_read_kernel_str",
        "probe_read_user",
        "probe_read_user_str",
        # Output: ring buffers and perf event arrays, consumed by clients.
        "ringbuf_reserve",
        "ringbuf_submit",
        "ringbuf_discard",
        "ringbuf_output",
        "ringbuf_query",
        # A ring buffer record of a size known only at run time (a deep stack
        # copy, gfx_udeep.h), written through its dynptr: still the program's
        # own ring, bounds checked by the kernel at every write.
        "ringbuf_reserve_dynptr",
        "ringbuf_submit_dynptr",
        "ringbuf_discard_dynptr",
        "dynptr_write",
        "perf_event_output",
        # Stack ids into a stack_trace map (the addresses stay in that map,
        # which the catalog keeps broker-only).
        "get_stackid",
        # uprobe/perf cookies (e.g. which function a uprobe is on).
        "get_attach_cookie",
        # The memory area of the current task that holds an address (its file,
        # start and page offset): where a shared library is mapped, as
        # /proc/self/maps would say. Its callback is the only one allowed.
        "find_vma",
    }
)

# The allowed helpers that take a callback (a BPF_PSEUDO_FUNC load); the
# verifier lets a function pointer go nowhere but such an argument.
CALLBACK_HELPERS = frozenset({"find_vma"})

# Helpers refused with a specific reason (everything not allowed is refused;
# these are the ones worth explaining).
FORBIDDEN_HELPERS = {
    "probe_write_user": "writes into user-space memory of the traced process",
    "override_return": "changes a kernel function's return value",
    "send_signal": "sends signals to the traced process",
    "send_signal_thread": "sends signals to the traced thread",
    "trace_printk": "writes to the global trace pipe (use a ring buffer)",
    "trace_vprintk": "writes to the global trace pipe (use a ring buffer)",
    "snprintf": "can format kernel pointers (%p) into client-visible data",
    "seq_printf": "seq_file output is for iterators, not tracing programs",
    "seq_write": "seq_file output is for iterators, not tracing programs",
    "seq_printf_btf": "seq_file output is for iterators, not tracing programs",
    "d_path": "resolves kernel paths of arbitrary files",
    "get_current_task": "returns a kernel pointer (task_struct)",
    "get_func_ip": "returns a kernel address",
    "get_stack": "copies raw (kernel) return addresses into program memory",
    "get_task_stack": "copies raw kernel return addresses",
    "probe_read": "legacy helper that guesses the address space; use probe_read_kernel/_user",
    "probe_read_str": "legacy helper that guesses the address space; use probe_read_*_str",
    "tail_call": "program arrays are not supported",
    "sys_bpf": "issues bpf() syscalls",
    "copy_from_user": "sleepable programs are not supported",
    "kptr_xchg": "stores kernel pointers in maps",
}

# Size limits. Catalog programs are a few hundred instructions.
MAX_PROGRAM_INSNS = 32_768  # 8-byte slots per linked program
MAX_PROGRAMS = 32  # loadable programs per object
MAX_MAPS = 32  # maps per object, global data included
MAX_MAP_MEMORY = 256 << 20  # bytes: keys + values (x CPUs for per-CPU) + ring buffers


@dataclass
class ProgramAudit:
    name: str
    section: str
    prog_type: int
    attach_kind: str
    insn_count: int = 0
    helpers: list[str] = field(default_factory=list)
    kfunc_calls: int = 0


@dataclass
class MapAudit:
    name: str  # the C variable or global-data section
    map_type: int
    key_size: int
    value_size: int
    max_entries: int
    memory: int  # bytes this map may use, estimated


@dataclass
class AuditReport:
    sha256: str
    programs: list[ProgramAudit] = field(default_factory=list)
    maps: list[MapAudit] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def map_memory(self) -> int:
        return sum(m.memory for m in self.maps)

    def verdict(self) -> str:
        if self.ok:
            return "accepted"
        return "refused: " + "; ".join(self.problems)

    def text(self) -> str:
        """What `gfxbpf-admin audit` prints."""
        lines = [f"sha256 {self.sha256}"]
        for p in self.programs:
            try:
                ptype = C.ProgType(p.prog_type).name.lower()
            except ValueError:
                ptype = f"type {p.prog_type}"
            lines.append(
                f"program {p.name}  section {p.section}  type {ptype} ({p.attach_kind})  "
                f"{p.insn_count} insns"
            )
            lines.append(f"  helpers: {', '.join(p.helpers) or 'none'}")
            if p.kfunc_calls:
                lines.append(f"  kfunc calls: {p.kfunc_calls}")
        for m in self.maps:
            lines.append(
                f"map {m.name}  type {_map_type_name(m.map_type)}  key {m.key_size}  "
                f"value {m.value_size}  max_entries {m.max_entries}  ~{m.memory} bytes"
            )
        lines.append(f"map memory ~{self.map_memory} bytes (limit {MAX_MAP_MEMORY})")
        for problem in self.problems:
            lines.append(f"problem: {problem}")
        lines.append(f"verdict: {self.verdict()}")
        return "\n".join(lines)


class AuditError(Exception):
    """The static audit refused the object; .report says everything it saw."""

    def __init__(self, report: AuditReport) -> None:
        super().__init__(report.verdict())
        self.report = report


def _map_type_name(t: int) -> str:
    try:
        return C.MapType(t).name.lower()
    except ValueError:
        return f"type {t}"


def _map_memory(m_type: int, key: int, value: int, entries: int, flags: int, ncpus: int) -> int:
    """What the kernel would hold for the map: the map budget's own estimate
    (broker/access/budget.py), so the audit and the budget use one model."""
    return budget.map_bytes(m_type, key, value, entries, flags, ncpus)


def audit_spec(spec: ObjectSpec, *, ncpus: int = 1) -> AuditReport:
    """Audit every program and map of a parsed object; never raises for a bad object."""
    report = AuditReport(sha256=spec.sha256)
    loadable = [p for p in spec.programs.values() if not p.is_subprog]
    if not loadable:
        report.problems.append("the object has no program")
    if len(loadable) > MAX_PROGRAMS:
        report.problems.append(f"{len(loadable)} programs, more than the limit of {MAX_PROGRAMS}")
    for p in loadable:
        _audit_program(spec, p, report)
    _audit_maps(spec, ncpus, report)
    return report


def _audit_program(spec: ObjectSpec, p: ProgramSpec, report: AuditReport) -> None:
    """The program's type, then what its linked instructions call and load."""
    pa = ProgramAudit(p.name, p.section, p.prog_type, p.attach_kind)
    report.programs.append(pa)
    why = program_kind_problem(p.prog_type, p.attach_kind)
    if why is not None:
        report.problems.append(
            f"program {p.name!r} (section {p.section!r}): program type "
            f"{_prog_type_name(p.prog_type)} as {p.attach_kind}: {why}"
        )
    try:
        linked = spec.link_program(p.name)
        facts = asm.analyze(bytes(linked.insns))
    except (ObjectError, ValueError) as e:
        report.problems.append(f"program {p.name!r}: cannot decode its instructions: {e}")
        return
    pa.insn_count = facts.insn_count
    pa.helpers = facts.helpers
    pa.kfunc_calls = len(facts.kfunc_calls)
    if facts.insn_count > MAX_PROGRAM_INSNS:
        report.problems.append(
            f"program {p.name!r}: {facts.insn_count} instructions once linked, more than "
            f"the limit of {MAX_PROGRAM_INSNS}"
        )
    report.problems.extend(_call_problems(p.name, facts))
    report.problems.extend(_extern_problems(spec, p.name, linked.map_refs))


def _extern_problems(
    spec: ObjectSpec, name: str, refs: list[tuple[int, str, str, int]]
) -> list[str]:
    """kfunc calls and __ksym loads, by the table in review/table.py (each named once)."""
    problems: list[str] = []
    seen: set[str] = set()
    for idx, ext_name, kind, _ in refs:
        e = spec.externs.get(ext_name) if kind in ("ksym", "kfunc") else None
        if e is None or ext_name in seen:
            continue
        seen.add(ext_name)
        why = extern_problem(e.kind, e.name, e.typed)
        if why is not None:
            what = "calls kfunc" if e.kind == "kfunc" else "loads __ksym"
            problems.append(f"program {name!r} {what} {ext_name} (instruction {idx}): {why}")
    return problems


def _prog_type_name(t: int) -> str:
    try:
        return C.ProgType(t).name.lower()
    except ValueError:
        return f"type {t}"


def _call_problems(name: str, facts: asm.ProgramFacts) -> list[str]:
    """Helpers off the allowlist (each named once), kfuncs, callback pointers."""
    problems: list[str] = []
    seen: set[str] = set()
    for idx, helper_id, helper in facts.helper_calls:
        if helper in ALLOWED_HELPERS or helper in seen:
            continue
        seen.add(helper)
        why = FORBIDDEN_HELPERS.get(helper, "not on the broker's helper allowlist")
        problems.append(
            f"program {name!r} calls bpf_{helper} (helper {helper_id}, instruction {idx}): {why}"
        )
    if facts.kfunc_calls:
        idx, btf_id = facts.kfunc_calls[0]
        problems.append(
            f"program {name!r} calls a kernel function (kfunc, BTF id {btf_id}, "
            f"instruction {idx}): kfunc calls are not allowed"
        )
    callbacks_to = {h for _, _, h in facts.helper_calls} & CALLBACK_HELPERS
    for idx, src, _ in facts.ld_imm64:
        if src == C.BPF_PSEUDO_FUNC and not callbacks_to:
            problems.append(
                f"program {name!r}: callback function pointer at instruction {idx} "
                "with no bpf_find_vma call to take it (bpf_loop and friends are not allowed)"
            )
            break
    return problems


def _audit_maps(spec: ObjectSpec, ncpus: int, report: AuditReport) -> None:
    """Map count, types and the memory they would take."""
    if len(spec.maps) > MAX_MAPS:
        report.problems.append(f"{len(spec.maps)} maps, more than the limit of {MAX_MAPS}")
    for m in spec.maps.values():
        mem = _map_memory(m.map_type, m.key_size, m.value_size, m.max_entries, m.flags, ncpus)
        report.maps.append(
            MapAudit(m.real_name, m.map_type, m.key_size, m.value_size, m.max_entries, mem)
        )
        why = map_type_problem(m.map_type)
        if why is not None:
            report.problems.append(
                f"map {m.real_name!r}: map type {_map_type_name(m.map_type)}: {why}"
            )
    if report.map_memory > MAX_MAP_MEMORY:
        report.problems.append(
            f"maps need ~{report.map_memory} bytes, more than the limit of {MAX_MAP_MEMORY}"
        )


def audit_bytes(data: bytes, name: str = "obj", *, ncpus: int = 1) -> AuditReport:
    """Parse and audit; an unparsable object is a report with the parse error."""
    try:
        spec = ObjectSpec.parse(data, name)
    except ObjectError as e:
        import hashlib

        report = AuditReport(sha256=hashlib.sha256(data).hexdigest())
        report.problems.append(f"not a usable BPF object: {e}")
        return report
    return audit_spec(spec, ncpus=ncpus)


def check(spec: ObjectSpec, *, ncpus: int = 1) -> AuditReport:
    """audit_spec, raising AuditError when it refuses."""
    report = audit_spec(spec, ncpus=ncpus)
    if not report.ok:
        raise AuditError(report)
    return report
