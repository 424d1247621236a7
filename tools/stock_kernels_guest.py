"""PID 1 of tools/stock_kernels.py's guest: what a Debian host's kernel does
with gfxbpf, printed on the serial console as JSON lines, then power off.

1. Every catalog object loaded with gfxbpf's loader (the attach types the
   broker gives, default read-only data); what the broker would answer for
   it on this kernel; one uprobe_multi link tried, as the broker makes them.
2. The product as a user meets it: the broker started as root with --user
   (it keeps only CAP_BPF and CAP_PERFMON), the policy `gfxbpf-admin approve`
   wrote on the host, and gfxclient run by an ordinary user on Python
   programs of hers: the steps the host lists (profiles, a watch), and a
   sysctl file applied between them.

The host writes /etc/gfxvm.json (the console mark, the users, the runs) and
puts this file at /init behind a #! line naming its Python.
"""

import ctypes
import json
import os
import subprocess
import sys
import time

CONF = json.load(open("/etc/gfxvm.json"))
PKG = "/opt/pkg"
SOCKET = "/run/gfxbpf/control.sock"
libc = ctypes.CDLL(None, use_errno=True)


def say(row):
    print(CONF["mark"] + json.dumps(row), flush=True)


def mount_all():
    gid = CONF["service_gid"]
    for src, where, kind, opts in (
        ("proc", "/proc", "proc", None),
        ("sys", "/sys", "sysfs", None),
        ("dev", "/dev", "devtmpfs", None),
        ("bpf", "/sys/fs/bpf", "bpf", "mode=0700"),  # as systemd mounts it
        # As tools/demo.sh and deploy/ mount it: the broker's group only.
        ("nodev", "/sys/kernel/tracing", "tracefs", f"gid={gid},mode=0750"),
        ("run", "/run", "tmpfs", "mode=0755"),
        ("tmp", "/tmp", "tmpfs", "mode=1777"),
    ):
        os.makedirs(where, exist_ok=True)
        data = opts.encode() if opts else None
        if libc.mount(src.encode(), where.encode(), kind.encode(), 0, data) != 0:
            say({"mount": where, "error": os.strerror(ctypes.get_errno())})


def load_every_object():
    from gfxbpf.bpf.link.attach import attach_uprobe_multi
    from gfxbpf.bpf.loader import load
    from gfxbpf.bpf.object import ObjectSpec
    from gfxbpf.catalog.entries import load_catalog
    from gfxbpf.catalog.instance import Unavailable, require_uprobe_multi, use_uprobe_multi
    from gfxbpf.catalog.objects import object_path

    for program in load_catalog():
        row = {"program": program.name, "unavailable": None}
        try:
            require_uprobe_multi(program)
        except Unavailable as e:
            row["unavailable"] = str(e)  # what the broker would answer; loaded all the same
        try:
            spec = ObjectSpec.from_file(str(object_path(program)))
            use_uprobe_multi(spec, program)  # as the broker loads it
            obj = load(spec)
        except Exception as e:
            row.update(ok=False, error=str(e), log=(getattr(e, "log", "") or "")[-3000:])
        else:
            with obj:
                row["ok"] = True
                if program.name == "ucalls":  # whether this kernel takes the link
                    try:
                        prog = obj.programs["ucall_entry"].fd
                        with attach_uprobe_multi(prog, sys.executable, ["Py_BytesMain"]):
                            row["uprobe_multi"] = "attached"
                    except Exception as e:
                        row["uprobe_multi"] = str(e)
        say(row)


def tail(path, n=4000):
    """The last n characters of a file (None: all of it), or why it could not be read."""
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:] if n else f.read()
    except OSError as e:
        return str(e)


def start_broker():
    os.makedirs("/run/gfxbpf", exist_ok=True)
    os.chown("/run/gfxbpf", CONF["service_uid"], CONF["service_gid"])
    log = open("/tmp/broker.log", "w")
    argv = [sys.executable, "/opt/bin/gfxbpf-broker", "--user", CONF["service_user"]]
    argv += ["--policy", "/etc/gfxbpf/policy.toml", "--socket", SOCKET]
    broker = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=ENV)
    deadline = time.monotonic() + CONF["broker_start_s"]
    while not os.path.exists(SOCKET):
        if broker.poll() is not None or time.monotonic() > deadline:
            return broker, False
        time.sleep(0.2)
    return broker, True


def run_as_user(run):
    """One gfxclient command as the ordinary user ({script}: her program), or
    another of gfxbpf's commands as root ("tool", "as_root": an
    administrator's check)."""
    home = f"/tmp/{CONF['user']}"
    os.makedirs(home, exist_ok=True)
    os.chown(home, CONF["user_uid"], CONF["user_uid"])
    out = f"{home}/{run['name']}.out"
    script = f"{home}/{run['name']}.py"
    with open(script, "w") as f:
        f.write(run.get("script", ""))
    words = {"{socket}": SOCKET, "{out}": out, "{script}": script, "{python}": sys.executable}
    tool = "/opt/bin/" + run.get("tool", "gfxclient")
    argv = [sys.executable, tool] + [words.get(w, w) for w in run["argv"]]
    env = dict(ENV, HOME=home, USER=CONF["user"])
    who = {"user": CONF["user_uid"], "group": CONF["user_uid"], "extra_groups": []}
    started = time.monotonic()
    try:
        r = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=env,
            cwd=home,
            timeout=CONF["client_s"],
            **({} if run.get("as_root") else who),
        )
        rc, stdout, stderr = r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        rc, stdout, stderr = "timeout", "", (e.stderr or b"").decode(errors="replace")
    say(
        {
            "run": run["name"],
            "argv": run["argv"],
            "sysctl": sysctls(),
            "rc": rc,
            "seconds": round(time.monotonic() - started, 1),
            "stdout": stdout[-200_000:],  # a whole `list --json`
            "stderr": stderr[-3000:],
            # the whole profile: the test weighs a chain against all of it (a
            # cut copy lost the heaviest stacks when a loaded host slowed the
            # guest and start-up left more stacks)
            "out": tail(out, None) if os.path.exists(out) else None,
        }
    )


def sysctls():
    values = {}
    for name in ("perf_event_paranoid", "unprivileged_bpf_disabled", "kptr_restrict"):
        values[name] = tail(f"/proc/sys/kernel/{name}").strip()
    return values


def apply_sysctl_file(path):
    """What `sysctl --system` does with one drop-in: key = value lines."""
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if "=" in line:
            key, value = (x.strip() for x in line.split("=", 1))
            with open("/proc/sys/" + key.replace(".", "/"), "w") as f:
                f.write(value)
    say({"applied": path, "sysctl": sysctls()})


def run_the_product():
    broker, up = start_broker()
    if not up:
        say({"broker": "did not start", "log": tail("/tmp/broker.log")})
        broker.kill()
        return
    for step in CONF["steps"]:
        if "sysctl_file" in step:
            apply_sysctl_file(step["sysctl_file"])
        else:
            run_as_user(step)
    broker.terminate()
    try:
        broker.wait(30)
    except subprocess.TimeoutExpired:
        broker.kill()
    with open("/tmp/broker.log", errors="replace") as f:
        checks = [line for line in f if '"host_check"' in line]  # said at start
    say(
        {
            "broker": "stopped",
            "rc": broker.returncode,
            "host_checks": checks,
            "log": tail("/tmp/broker.log"),
        }
    )


ENV = {"PATH": "/usr/bin:/bin", "PYTHONPATH": PKG, "LANG": "C.UTF-8"}
sys.path.insert(0, PKG)
mount_all()
say({"kernel": os.uname().release, "sysctl": sysctls()})
try:
    load_every_object()
    run_the_product()
except BaseException as e:  # PID 1 must not die: say why and power off
    say({"guest_error": f"{type(e).__name__}: {e}"})
libc.sync()
libc.reboot(0x4321FEDC)  # RB_POWER_OFF
