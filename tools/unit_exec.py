"""Run a command the way a systemd unit would, without systemd: via setpriv(1).

Tests use this to start the broker "from the unit's own ExecStart line": the
argv, the user and group, the capabilities and no_new_privs all come from
deploy/gfxbpf.service, so the unit and the tests cannot drift apart.

    from unit_exec import setpriv_argv
    argv = setpriv_argv("deploy/gfxbpf.service", {"--policy": "/tmp/p.toml"})
    subprocess.Popen(argv)

Only the subset of unit-file syntax the project's units use is understood
(comments, line continuations, quoting, repeated and empty assignments,
ExecStart prefixes "-" ":" "@"); anything else raises UnitError rather than
being guessed. The sandboxing settings (ProtectSystem=, SystemCallFilter=...)
cannot be reproduced by setpriv and are ignored here.
"""

from __future__ import annotations

import pwd
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

_TRUE = frozenset({"1", "yes", "true", "on"})
_FALSE = frozenset({"0", "no", "false", "off"})

# Keys of `overrides` (besides "--flag" keys) and what they replace.
OVERRIDE_KEYS = (
    "ExecStart",
    "program",
    "User",
    "Group",
    "AmbientCapabilities",
    "CapabilityBoundingSet",
    "NoNewPrivileges",
)


class UnitError(ValueError):
    """The unit file cannot be read or uses syntax this module does not handle."""


@dataclass(frozen=True)
class UnitExec:
    """What a service unit runs, and with which identity and privileges."""

    argv: list[str]
    user: str | None
    group: str | None
    ambient_caps: frozenset[str]  # lower case, without CAP_: {"bpf", "perfmon"}
    bounding_caps: frozenset[str] | None  # None: not restricted by the unit
    no_new_privileges: bool
    environment: dict[str, str] = field(default_factory=dict)
    umask: int | None = None


def read_unit(path: str | Path) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> every assigned value, in file order (raw strings).

    Empty assignments are kept as "" so callers can apply systemd's "an empty
    value resets the list" rule.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UnitError(f"{path}: cannot read the unit file: {e}") from e
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    pending = ""  # a logical line continued with a trailing backslash
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line.startswith(("#", ";")):
            continue  # comments, also inside a continued line
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = (pending + line).strip(), ""
        if not line:
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise UnitError(f"{path}:{lineno}: malformed section header {line!r}")
            current = sections.setdefault(line[1:-1], {})
            continue
        if current is None:
            raise UnitError(f"{path}:{lineno}: assignment outside any [Section]: {line!r}")
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise UnitError(f"{path}:{lineno}: expected Key=value, got {line!r}")
        current.setdefault(key.strip(), []).append(value.strip())
    if pending:
        raise UnitError(f"{path}: the file ends inside a continued line")
    return sections


def _last(values: list[str] | None) -> str | None:
    return values[-1] if values else None


def _bool(value: str, key: str, where: str) -> bool:
    v = value.lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise UnitError(f"{where}: {key}={value!r} is not a boolean")


def _caps(values: list[str] | None, key: str, where: str) -> frozenset[str] | None:
    """Union of the assignments after the last empty one; None if never set."""
    if values is None:
        return None
    caps: set[str] = set()
    for value in values:
        if value == "":
            caps.clear()
            continue
        if value.startswith("~"):
            raise UnitError(f"{where}: {key}=~... (inverted capability list) is not supported")
        for name in value.split():
            if not name.upper().startswith("CAP_") or len(name) <= 4:
                raise UnitError(f"{where}: {key}: {name!r} is not a capability name")
            caps.add(name[4:].lower())
    return frozenset(caps)


def _split_exec(line: str, where: str) -> list[str]:
    """ExecStart= value -> argv, honouring the prefixes that keep privileges."""
    prefixes = ""
    while line[:1] in ("-", "@", ":", "+", "!"):
        prefixes += line[0]
        line = line[1:]
    if "+" in prefixes or "!" in prefixes:
        raise UnitError(f"{where}: ExecStart prefix {prefixes!r} changes privileges; not supported")
    if "%" in line.replace("%%", "") or "$" in line:
        raise UnitError(
            f"{where}: ExecStart uses specifiers or variables ({line!r}); not supported"
        )
    try:
        argv = shlex.split(line.replace("%%", "%"))
    except ValueError as e:
        raise UnitError(f"{where}: cannot split ExecStart {line!r}: {e}") from e
    if "@" in prefixes:
        if len(argv) < 2:
            raise UnitError(f"{where}: ExecStart=@ needs a path and an argv[0]")
        # `@path name args`: setpriv cannot set argv[0]; the path is what runs.
        argv = [argv[0]] + argv[2:]
    if not argv or not argv[0].startswith("/"):
        raise UnitError(f"{where}: ExecStart must start with an absolute path, got {line!r}")
    return argv


def _environment(values: list[str] | None, where: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for value in values or []:
        if value == "":
            env.clear()
            continue
        for item in shlex.split(value):
            name, sep, val = item.partition("=")
            if not sep or not name:
                raise UnitError(f"{where}: Environment entry {item!r} is not NAME=value")
            env[name] = val
    return env


def unit_exec(path: str | Path) -> UnitExec:
    """Read a service unit's ExecStart, User, Group, capabilities and more."""
    where = str(path)
    service = read_unit(path).get("Service")
    if service is None:
        raise UnitError(f"{where}: no [Service] section")
    starts: list[str] = []
    for value in service.get("ExecStart", []):
        if value:
            starts.append(value)
        else:
            starts.clear()  # an empty assignment resets the list
    if len(starts) != 1:
        raise UnitError(f"{where}: expected exactly one ExecStart= line, found {len(starts)}")
    umask = _last(service.get("UMask"))
    try:
        umask_value = int(umask, 8) if umask else None
    except ValueError as e:
        raise UnitError(f"{where}: UMask={umask!r} is not an octal number") from e
    nnp = _last(service.get("NoNewPrivileges"))
    return UnitExec(
        argv=_split_exec(starts[0], where),
        user=_last(service.get("User")) or None,
        group=_last(service.get("Group")) or None,
        ambient_caps=_caps(service.get("AmbientCapabilities"), "AmbientCapabilities", where)
        or frozenset(),
        bounding_caps=_caps(service.get("CapabilityBoundingSet"), "CapabilityBoundingSet", where),
        no_new_privileges=_bool(nnp, "NoNewPrivileges", where) if nnp else False,
        environment=_environment(service.get("Environment"), where),
        umask=umask_value,
    )


def _override_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """Replace FLAG's value (`--flag v` or `--flag=v`); append if absent; "" removes it."""
    out: list[str] = []
    found = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == flag and i + 1 < len(argv) and i > 0:
            found = True
            if value:
                out += [flag, value]
            i += 2
            continue
        if arg.startswith(flag + "=") and i > 0:
            found = True
            if value:
                out.append(f"{flag}={value}")
            i += 1
            continue
        out.append(arg)
        i += 1
    if not found and value:
        out += [flag, value]
    return out


def apply_overrides(info: UnitExec, overrides: dict[str, str], where: str = "") -> UnitExec:
    """A copy of `info` with unit settings and ExecStart flags replaced.

    Keys: "--flag" replaces that flag's value in argv (appended when the line
    lacks it; "" removes the flag). "program" replaces argv[0] (e.g. another
    venv). "ExecStart", "User", "Group", "AmbientCapabilities",
    "CapabilityBoundingSet", "NoNewPrivileges" replace the unit setting, with
    values written as in a unit file.
    """
    argv = list(info.argv)
    user, group = info.user, info.group
    ambient, bounding, nnp = info.ambient_caps, info.bounding_caps, info.no_new_privileges
    where = where or "overrides"
    if "ExecStart" in overrides:
        argv = _split_exec(overrides["ExecStart"], where)
    for key, value in overrides.items():
        if key.startswith("--"):
            argv = _override_flag(argv, key, value)
        elif key == "program":
            if not value.startswith("/"):
                raise UnitError(f"{where}: program must be an absolute path, got {value!r}")
            argv[0] = value
        elif key == "User":
            user = value or None
        elif key == "Group":
            group = value or None
        elif key == "AmbientCapabilities":
            ambient = _caps([value], key, where) or frozenset()
        elif key == "CapabilityBoundingSet":
            bounding = _caps([value], key, where)
        elif key == "NoNewPrivileges":
            nnp = _bool(value, key, where)
        elif key != "ExecStart":
            raise UnitError(
                f"{where}: unknown override {key!r} (use '--flag' or one of "
                f"{', '.join(OVERRIDE_KEYS)})"
            )
    return UnitExec(argv, user, group, ambient, bounding, nnp, dict(info.environment), info.umask)


def _cap_list(caps: frozenset[str]) -> str:
    return ",".join(["-all"] + [f"+{c}" for c in sorted(caps)])


def setpriv_argv(unit_path: str | Path, overrides: dict[str, str] | None = None) -> list[str]:
    """setpriv(1) command line that runs the unit's ExecStart as the unit would.

    As the unit's User/Group (primary group only, like a unit without
    SupplementaryGroups=), with its AmbientCapabilities as the inheritable and
    ambient sets, its CapabilityBoundingSet as the bounding set, and
    NoNewPrivileges. Must be run as root. See apply_overrides for `overrides`.
    """
    info = apply_overrides(unit_exec(unit_path), overrides or {}, str(unit_path))
    if info.user is None:
        raise UnitError(f"{unit_path}: no User= (setpriv would run the command as root)")
    group = info.group
    if group is None:  # systemd uses the user's primary group
        try:
            group = str(pwd.getpwnam(info.user).pw_gid)
        except KeyError as e:
            raise UnitError(
                f"{unit_path}: user {info.user!r} does not exist and the unit names no "
                "Group= (create it first, e.g. systemd-sysusers deploy/sysusers.d/...)"
            ) from e
    argv = ["setpriv", f"--reuid={info.user}", f"--regid={group}", "--clear-groups"]
    if info.ambient_caps:
        argv += [
            f"--inh-caps={_cap_list(info.ambient_caps)}",
            f"--ambient-caps={_cap_list(info.ambient_caps)}",
        ]
    if info.bounding_caps is not None:
        argv.append(f"--bounding-set={_cap_list(info.bounding_caps)}")
    if info.no_new_privileges:
        argv.append("--no-new-privs")
    return argv + ["--"] + info.argv


def mount_options(path: str | Path) -> list[str]:
    """The Options= of a .mount unit or drop-in, split on commas."""
    values = read_unit(path).get("Mount", {}).get("Options")
    if not values or not values[-1]:
        raise UnitError(f"{path}: no Options= in [Mount]")
    return [o.strip() for o in values[-1].split(",") if o.strip()]


def main(argv: list[str]) -> int:
    """`unit_exec.py UNIT [--print-argv] [--flag=value | Key=value ...]`.

    Prints the setpriv command that runs the unit's ExecStart as its User with
    its capabilities: shell-quoted on one line, or with --print-argv one
    argument per line (for `mapfile` in shell scripts).
    """
    usage = f"usage: {argv[0]} UNIT [--print-argv] [--flag=value | Key=value ...]"
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(usage)
        return 0 if len(argv) >= 2 else 1
    one_per_line = "--print-argv" in argv[2:]
    opts: dict[str, str] = {}
    for a in argv[2:]:
        if a == "--print-argv":
            continue
        k, _, v = a.partition("=")
        opts[k] = v
    try:
        cmd = setpriv_argv(argv[1], opts)
    except UnitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("\n".join(cmd) if one_per_line else shlex.join(cmd))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
