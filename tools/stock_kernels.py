#!/usr/bin/env python3
"""Load every catalog object on Debian's own kernels, booted under qemu.

    tools/stock_kernels.py [--release debian12] [--release debian13] [--json]

This project's machines run Linux 6.18, but a Debian 12 host runs 6.1 and a
Debian 13 host 6.12, and an older verifier refuses programs a newer one
accepts (6.1 refuses a loop whose last block falls through into its head, and
plain memory as a map key). For each release this fetches Debian's stock
kernel package (apt-get download, cached in /var/cache/gfxbpf/kernels), packs
an initramfs of this Python, its standard library, pyelftools and gfxbpf's
loader and catalog, boots it under qemu (software emulation, one CPU, ~1
minute) and loads each catalog object there with gfxbpf's loader: every
program through the verifier, with the attach types the broker gives them
and the object's default read-only data. Each row also says whether the
broker would refuse the program on that kernel (catalog/instance.py,
require_uprobe_multi), and the guest tries one uprobe_multi link, as the
broker makes them. Exit 1 when any object is refused. Needs root
(apt-get), qemu-system-x86 and the release's kernel in apt's sources.
docs/ARCHITECTURE.md, "Kernels", says why.
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
PACKAGES = ("bpf", "catalog", "elf", "tomlcheck")  # what loading an object imports
MARK = "GFXVM "  # the guest's result lines on the serial console
BOOT_SECONDS = 600

# PID 1 in the guest: mount what the loader reads, load each catalog object,
# print one line per object, power off.
INIT = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for src, where, kind in (("proc", "/proc", "proc"), ("sys", "/sys", "sysfs"),
                         ("dev", "/dev", "devtmpfs"), ("bpf", "/sys/fs/bpf", "bpf")):
    os.makedirs(where, exist_ok=True)
    libc.mount(src.encode(), where.encode(), kind.encode(), 0, None)
sys.path.insert(0, "/opt/pkg")
from gfxbpf.bpf.link.attach import attach_uprobe_multi
from gfxbpf.bpf.loader import load
from gfxbpf.bpf.object import ObjectSpec
from gfxbpf.catalog.entries import load_catalog
from gfxbpf.catalog.instance import Unavailable, require_uprobe_multi, use_uprobe_multi
from gfxbpf.catalog.objects import object_path


def uprobe_multi(obj):
    # Whether this kernel takes a uprobe_multi link, as the broker makes them.
    try:
        with attach_uprobe_multi(obj.programs["ucall_entry"].fd, sys.executable, ["Py_BytesMain"]):
            return "attached"
    except Exception as e:
        return str(e)


print("%(mark)s" + json.dumps({"kernel": os.uname().release}), flush=True)
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
            if program.name == "ucalls":
                row["uprobe_multi"] = uprobe_multi(obj)
    print("%(mark)s" + json.dumps(row), flush=True)
libc.sync()
libc.reboot(0x4321FEDC)  # RB_POWER_OFF
"""


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
    """pyelftools and the gfxbpf subpackages a load imports, under /opt/pkg."""
    skip = shutil.ignore_patterns("__pycache__", "*.c", "*.h")
    spec = importlib.util.find_spec("elftools")
    if spec is None or not spec.submodule_search_locations:
        die("pyelftools is not importable here; run this with gfxbpf's venv python")
    shutil.copytree(spec.submodule_search_locations[0], root / "opt/pkg/elftools", ignore=skip)
    for name in PACKAGES:
        sub = importlib.util.find_spec(f"gfxbpf.{name}")
        if sub is None or not sub.submodule_search_locations:
            die(f"gfxbpf.{name} is not importable here")
        where = root / "opt/pkg/gfxbpf" / name
        shutil.copytree(sub.submodule_search_locations[0], where, ignore=skip)


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
    for d in ("proc", "sys", "dev", "tmp"):
        (root / d).mkdir(parents=True)
    python = stage_python(root)
    stage_packages(root)
    init = root / "init"
    init.write_text(f"#!{python} -I\n" + INIT % {"mark": MARK})
    init.chmod(0o755)
    image = into / "initrd.gz"
    image.write_bytes(gzip.compress(cpio_newc(root), compresslevel=1))
    return image


def boot(kernel: Path, initrd: Path) -> tuple[str, list[dict[str, Any]]]:
    """Boot under qemu; the guest's kernel release and one row per object."""
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
    return str(rows[0]["kernel"]), rows[1:]


def check(release: str, initrd: Path) -> dict[str, Any]:
    release_name, rows = boot(kernel_image(release), initrd)
    return {"release": release, "kernel": release_name, "objects": rows}


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
        for release, o in refused:
            print(f"  {release}: {o['program']} refused: {o['error']}\n{o['log']}")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
