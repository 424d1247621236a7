#!/usr/bin/env python3
"""gfxbpf on Debian's own kernels, booted under qemu: every catalog object
loaded, then the broker and an ordinary user's gfxclient, as on a host.

    tools/stock_kernels.py [--release debian12] [--release debian13] [--json]

This project's machines run Linux 6.18, but a Debian 12 host runs 6.1 and a
Debian 13 host 6.12, with Debian's settings: an older verifier refuses
programs a newer one accepts (6.1 refuses a loop whose last block falls
through into its head, and plain memory as a map key), and Debian's
kernel.perf_event_paranoid = 3 lets only CAP_SYS_ADMIN open perf events.
For each release this fetches Debian's stock kernel package (apt-get
download, cached in /var/cache/gfxbpf/kernels), packs an initramfs of this
Python, its standard library, gfxbpf and its libraries, the policy
`gfxbpf-admin approve` writes and deploy/'s sysctl file, and boots it under
qemu (software emulation, one CPU, under a minute). There PID 1
(tools/stock_kernels_guest.py):

1. loads each catalog object with gfxbpf's loader (the attach types the
   broker gives, the default read-only data), says whether the broker would
   refuse the program there (require_uprobe_multi), and tries one
   uprobe_multi link;
2. starts the broker as root with --user, and runs as an ordinary user a
   CPU profile of her Python program and a tracepoint watch on the kernel's
   own settings, then applies deploy/sysctl.d/60-gfxbpf.conf and runs them
   again, with an off-CPU profile and her stacks at libc's getpid
   (--stacks-at: a uprobe_multi link).

Exit 1 when any object is refused. Needs root (apt-get), qemu-system-x86 and
the release's kernel in apt's sources. docs/ARCHITECTURE.md, "Kernels",
says why.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

CACHE = Path(os.environ.get("GFXBPF_KERNEL_CACHE", "/var/cache/gfxbpf/kernels"))
# apt packages whose kernel each release runs. On a Debian 12 host the stock
# metapackage is 6.1's; Debian 12 also carries Debian 13's 6.12 line.
RELEASES = {"debian12": "linux-image-amd64", "debian13": "linux-image-6.12-amd64"}
# What the broker and gfxclient import: gfxbpf's layers and its dependencies.
GFXBPF = ("bpf", "catalog", "elf", "tomlcheck", "proto", "broker", "client")
LIBRARIES = ("elftools", "grpc", "google.protobuf", "prctl", "_prctl")
COMMANDS = {  # pyproject's scripts: (module, function)
    "gfxbpf-broker": ("gfxbpf.broker.main", "main"),
    "gfxclient": ("gfxbpf.client.cli.gfxclient", "run"),
}
SERVICE_USER, SERVICE_UID = "gfxbpf", 4243  # the broker's account
USER, USER_UID = "alice", 4242  # an ordinary user, as in the test suite
LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
APPROVED = {  # what her commands need, as `gfxbpf-admin approve` writes it
    "stackcopy": [],
    "offcpu": [],
    "clonecount": [],
    "ustackcopy": ["--libraries", LIBC, "--functions", "getpid"],
}
SYSCTL = "deploy/sysctl.d/60-gfxbpf.conf"  # the host settings deploy/README.md asks for
ROOT = Path(__file__).resolve().parent.parent
CPU_SCRIPT = """import time
def gfx_leaf(end):
    while time.monotonic() < end:
        pass
def gfx_outer(end):
    gfx_leaf(end)
gfx_outer(time.monotonic() + 3)
"""
NAP_SCRIPT = """import time
def gfx_nap(end):
    while time.monotonic() < end:
        time.sleep(0.02)
def gfx_waiter(end):
    gfx_nap(end)
gfx_waiter(time.monotonic() + 2)
"""
CALLS_SCRIPT = """import os
def gfx_ask(n):
    for _ in range(n):
        os.getpid()
def gfx_caller():
    gfx_ask(1000)
gfx_caller()
"""
PROFILE = ["profile", "--socket", "{socket}", "--format", "folded", "-o", "{out}", "--"]
WATCH = ["watch", "clonecount", "--socket", "{socket}", "--duration", "2", "--json"]
# What the user does in the guest, in order: first on the kernel's own
# settings, then again after the host settings of deploy/ are applied.
CPU = {"name": "cpu", "argv": PROFILE + ["{python}", "{script}"], "script": CPU_SCRIPT}
OFFCPU = {"argv": ["profile", "--off-cpu"] + PROFILE[1:] + ["{python}", "{script}"]}
LIST = ["list", "--socket", "{socket}", "--json"]
# The administrator's check of the policy, as root (whose CAP_SYS_ADMIN must
# not hide what the kernel refuses the broker).
CHECK = {
    "tool": "gfxbpf-broker",
    "as_root": True,
    "argv": ["--check-policy", "--policy", "/etc/gfxbpf/policy.toml"],
}
STEPS: list[dict[str, Any]] = [
    dict(CHECK, name="check_policy_stock"),
    {"name": "list_stock", "argv": LIST},
    dict(CPU, name="cpu_stock"),
    {"name": "tracepoint_stock", "argv": WATCH},
    {"sysctl_file": "/etc/sysctl.d/60-gfxbpf.conf"},
    {"name": "list", "argv": LIST},
    dict(CHECK, name="check_policy"),
    CPU,
    {"name": "tracepoint", "argv": WATCH},
    dict(OFFCPU, name="offcpu", script=NAP_SCRIPT),
    {
        "name": "stacks_at",  # a uprobe_multi link: refused before Linux 6.6
        "argv": ["profile", "--stacks-at", f"{LIBC}:getpid"]
        + PROFILE[1:]
        + ["{python}", "{script}"],
        "script": CALLS_SCRIPT,
    },
]
MARK = "GFXVM "  # the guest's result lines on the serial console
BOOT_SECONDS = 600

GUEST = Path(__file__).with_name("stock_kernels_guest.py")  # the guest's /init


def die(message: str) -> None:
    raise SystemExit(f"stock_kernels: {message}")


def run(argv: list[str], cwd: Path | None = None) -> str:
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        die(f"{' '.join(argv)} failed: {r.stderr.strip()[-500:]}")
    return r.stdout


def kernel_image(release: str) -> Path:
    """The release's stock vmlinuz, fetched once into CACHE."""
    package = RELEASES[release]
    deps = run(["apt-cache", "depends", package])
    m = re.search(r"Depends: (linux-image-[0-9][^\s]*)", deps)
    if not m:
        die(f"apt knows no kernel behind {package}; is {release}'s archive in apt's sources?")
    name = m.group(1)
    root = CACHE / name
    found = sorted(root.glob("boot/vmlinuz-*"))
    if not found:
        with tempfile.TemporaryDirectory() as tmp:
            run(["apt-get", "download", name], cwd=Path(tmp))
            (deb,) = Path(tmp).glob("*.deb")
            try:
                root.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                die(f"cannot create {root} ({e.strerror}): run as root, or set GFXBPF_KERNEL_CACHE")
            run(["dpkg-deb", "-x", str(deb), str(root)])
        found = sorted(root.glob("boot/vmlinuz-*"))
    if not found:
        die(f"{name} holds no boot/vmlinuz-*")
    return found[0]


def shared_libraries(binary: Path) -> list[Path]:
    out = run(["ldd", str(binary)])
    return [Path(p) for p in re.findall(r"(/\S+) \(0x", out)]


def put(src: Path, dst_root: Path, dst: Path | None = None) -> None:
    """Copy src (following links) to the same path, or dst, under dst_root."""
    target = dst_root / str(dst or src).lstrip("/")
    if target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, target)


def stage_python(root: Path) -> str:
    """This interpreter, its libraries and standard library; its path in root."""
    python = Path(os.path.realpath(sys.executable))
    put(python, root)
    for lib in shared_libraries(python):
        put(lib, root)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    skip = shutil.ignore_patterns(
        "test", "tests", "__pycache__", "site-packages", "dist-packages", "idlelib", "tkinter"
    )
    shutil.copytree(stdlib, root / str(stdlib).lstrip("/"), ignore=skip, symlinks=False)
    for ext in (stdlib / "lib-dynload").glob("*.so"):
        for lib in shared_libraries(ext):
            put(lib, root)
    return str(python)


def stage_packages(root: Path) -> None:
    """gfxbpf, the libraries it imports and their shared libraries, under /opt/pkg."""
    skip = shutil.ignore_patterns("__pycache__", "*.c", "*.h", "*.pyi", "py.typed")
    pkg = root / "opt/pkg"
    for name in GFXBPF:
        sub = importlib.util.find_spec(f"gfxbpf.{name}")
        if sub is None or not sub.submodule_search_locations:
            die(f"gfxbpf.{name} is not importable here; run this with gfxbpf's venv python")
        shutil.copytree(sub.submodule_search_locations[0], pkg / "gfxbpf" / name, ignore=skip)
    for name in LIBRARIES:
        spec = importlib.util.find_spec(name)
        if spec is None:
            die(f"{name} is not importable here; run this with gfxbpf's venv python")
        if spec.submodule_search_locations:  # a package: its folder, as named
            src = Path(next(iter(spec.submodule_search_locations)))
            shutil.copytree(src, pkg / name.replace(".", "/"), ignore=skip)
        else:
            assert spec.origin
            shutil.copy2(spec.origin, pkg / Path(spec.origin).name)
    for ext in pkg.rglob("*.so"):
        for lib in shared_libraries(ext):
            put(lib, root)
    for tool, (module, function) in COMMANDS.items():
        script = root / "opt/bin" / tool
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(f"import sys\nfrom {module} import {function}\nsys.exit({function}())\n")


def write_policy(root: Path) -> None:
    """What `gfxbpf-admin approve` writes by default for the guest's user."""
    admin = Path(sys.executable).with_name("gfxbpf-admin")
    if not admin.exists():
        die(f"{admin} not found; run this with gfxbpf's venv python")
    text = "".join(
        run([str(admin), "approve", name, "--users", str(USER_UID), "--scope", "self", *more])
        for name, more in APPROVED.items()
    )
    (root / "etc/gfxbpf").mkdir(parents=True)
    (root / "etc/gfxbpf/policy.toml").write_text(text)


def write_users(root: Path) -> None:
    (root / "etc/passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\n"
        f"{SERVICE_USER}:x:{SERVICE_UID}:{SERVICE_UID}::/nonexistent:/usr/sbin/nologin\n"
        f"{USER}:x:{USER_UID}:{USER_UID}::/tmp/{USER}:/bin/sh\n"
    )
    (root / "etc/group").write_text(
        f"root:x:0:\n{SERVICE_USER}:x:{SERVICE_UID}:\n{USER}:x:{USER_UID}:\n"
    )


def cpio_newc(root: Path) -> bytes:
    """root's tree as a newc cpio archive (the initramfs format)."""
    out = bytearray()

    def entry(name: str, mode: int, data: bytes, ino: int) -> None:
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name) + 1, 0]
        out.extend(b"070701" + "".join(f"{f:08x}" for f in fields).encode())
        out.extend(name.encode() + b"\0")
        out.extend(b"\0" * (-len(out) % 4))
        out.extend(data)
        out.extend(b"\0" * (-len(out) % 4))

    ino = 1
    for path in sorted(root.rglob("*")):
        rel, st = str(path.relative_to(root)), path.lstat()
        if stat.S_ISLNK(st.st_mode):
            data = os.readlink(path).encode()
        elif stat.S_ISREG(st.st_mode):
            data = path.read_bytes()
        else:
            data = b""
        entry(rel, st.st_mode, data, ino)
        ino += 1
    entry("TRAILER!!!", 0, b"", 0)
    return bytes(out)


def initramfs(into: Path) -> Path:
    root = into / "root"
    for d in ("proc", "sys", "dev", "tmp", "run", "etc"):
        (root / d).mkdir(parents=True)
    python = stage_python(root)
    stage_packages(root)
    write_users(root)
    write_policy(root)
    (root / "etc/sysctl.d").mkdir()
    shutil.copy2(ROOT / SYSCTL, root / "etc/sysctl.d/60-gfxbpf.conf")
    conf = {
        "mark": MARK,
        "service_user": SERVICE_USER,
        "service_uid": SERVICE_UID,
        "service_gid": SERVICE_UID,
        "user": USER,
        "user_uid": USER_UID,
        "broker_start_s": 120,
        "client_s": 240,
        "steps": STEPS,
    }
    (root / "etc/gfxvm.json").write_text(json.dumps(conf))
    init = root / "init"
    init.write_text(f"#!{python} -I\n" + GUEST.read_text())
    init.chmod(0o755)
    for d in [root, *root.rglob("*")]:  # the user runs Python from under /root, too
        if d.is_dir() and not d.is_symlink():
            d.chmod(0o755)
    image = into / "initrd.gz"
    image.write_bytes(gzip.compress(cpio_newc(root), compresslevel=1))
    return image


def boot(kernel: Path, initrd: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Boot under qemu; the guest's first row (its kernel release and sysctls),
    then one row per object, per step and about the broker."""
    if not shutil.which("qemu-system-x86_64"):
        die("qemu-system-x86_64 not found (Debian: apt-get install qemu-system-x86)")
    # Software emulation: nested KVM hangs on some of this project's VMs.
    argv = ["qemu-system-x86_64", "-accel", "tcg", "-cpu", "max", "-m", "2048", "-smp", "1"]
    argv += ["-nographic", "-no-reboot", "-kernel", str(kernel), "-initrd", str(initrd)]
    argv += ["-append", "console=ttyS0 panic=-1 quiet"]
    try:
        r = subprocess.run(argv, capture_output=True, timeout=BOOT_SECONDS)
    except subprocess.TimeoutExpired:
        die(f"{kernel.name} did not power off within {BOOT_SECONDS} s")
    lines = r.stdout.decode(errors="replace").replace("\r", "").splitlines()
    # The firmware's screen resets may share the guest's first line.
    rows = [json.loads(ln.split(MARK, 1)[1]) for ln in lines if MARK in ln]
    if not rows or "kernel" not in rows[0]:
        die(f"{kernel.name} printed no result; its console ended:\n" + "\n".join(lines[-30:]))
    return rows[0], rows[1:]


def check(release: str, initrd: Path) -> dict[str, Any]:
    first, rows = boot(kernel_image(release), initrd)
    return {
        "release": release,
        "kernel": first["kernel"],
        "sysctl": first["sysctl"],
        "objects": [r for r in rows if "program" in r],
        "runs": [r for r in rows if "run" in r or "applied" in r],
        "broker": [r for r in rows if "broker" in r],
        "errors": [r for r in rows if "guest_error" in r or "mount" in r],
    }


def summary(step: dict[str, Any]) -> str:
    """One line for a guest step: a gfxclient command, a sysctl file, the broker."""
    if "applied" in step:
        return f"applied {step['applied']}: {step['sysctl']}"
    if "run" in step:
        paranoid = step["sysctl"]["perf_event_paranoid"]
        plumbing = {"--socket", "--format", "folded", "-o", "--"}
        words = [w for w in step["argv"] if w not in plumbing and not w.startswith("{")]
        head = f"gfxclient {' '.join(words)} (paranoid {paranoid}): rc {step['rc']}"
        said = (step["stderr"].strip().splitlines() or [""])[-1]
        return f"{head}, {step['seconds']} s" + (f": {said}" if step["rc"] else "")
    if "broker" in step:
        return f"broker {step['broker']}, rc {step.get('rc')}"
    return json.dumps(step)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--release", action="append", choices=sorted(RELEASES), help="(repeat)")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = ap.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="gfxbpf-vm-") as tmp:
        initrd = initramfs(Path(tmp))  # the same for every kernel
        for release in args.release or sorted(RELEASES):
            print(f"stock_kernels: booting {release}'s kernel ...", file=sys.stderr, flush=True)
            results.append(check(release, initrd))
    refused = [(r["release"], o) for r in results for o in r["objects"] if not o["ok"]]
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for r in results:
            ok = sum(1 for o in r["objects"] if o["ok"])
            print(f"{r['release']} (Linux {r['kernel']}): {ok} of {len(r['objects'])} loaded")
            refusing = [o["program"] for o in r["objects"] if o["unavailable"]]
            if refusing:
                print(f"  the broker refuses there (no uprobe_multi links): {', '.join(refusing)}")
            for step in r["runs"] + r["broker"] + r["errors"]:
                print("  " + summary(step))
        for release, o in refused:
            print(f"  {release}: {o['program']} refused: {o['error']}\n{o['log']}")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
