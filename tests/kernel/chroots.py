"""A Debian 13 (trixie) userland for the kernel tests: another glibc, compiler, Python.

The session fixture `debian13_root` (tests/kernel/conftest.py) makes one per
test session with tools/debian13_rootfs.sh (debootstrap minbase with python3,
xz-utils and gzip; the same cached tarball tools/debian13.sh uses, in
/var/cache/gfxbpf; mirror from GFXBPF_DEBIAN_MIRROR) and returns its path: a
directory every test user can enter and read. Tests start programs in it as
a test user with `popen_in`, isolated as a plain chroot, a chroot in a
mount namespace of its own, or a container (own mount namespace,
pivot_root): the three ways /proc/PID/maps names its files to a profiler
outside (the container's only through /proc/PID/root).

It works inside the userland of tools/debian13.sh too (a trixie root in trixie).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.conftest import skip_or_fail
from tests.kernel.brokerenv import ROOT, ensure_user

ROOTFS_SCRIPT = ROOT / "tools" / "debian13_rootfs.sh"
CHROOT_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/"}
MAKE_TIMEOUT_S = 1200  # a cold cache downloads ~50 MB of packages


def make_debian13_root(suite: str = "trixie", include: str | None = None) -> Path:
    """A fresh Debian userland under /var/tmp (mode 0755); its path. Debian 13
    with the script's packages unless told another suite and package list
    (Debian unstable's python3.15: suite="sid", include="python3.15")."""
    if os.geteuid() != 0:
        skip_or_fail("making a Debian userland needs root (debootstrap)")
    work = Path(tempfile.mkdtemp(prefix=f"gfxbpf-{suite}-root-", dir="/var/tmp"))
    work.chmod(0o755)
    root = work / "root"
    env = {**os.environ, "GFXBPF_ROOTFS_SUITE": suite}
    if include is not None:
        env["GFXBPF_ROOTFS_INCLUDE"] = include
    try:
        r = subprocess.run(
            [str(ROOTFS_SCRIPT), str(root)],
            capture_output=True,
            text=True,
            timeout=MAKE_TIMEOUT_S,
            env=env,
        )
    except subprocess.TimeoutExpired:
        remove_root(root)
        skip_or_fail(f"debootstrap of Debian {suite} took over {MAKE_TIMEOUT_S} s")
        raise
    if r.returncode != 0:
        remove_root(root)
        skip_or_fail(f"cannot make a Debian {suite} userland: {r.stderr.strip()[-2000:]}")
    root.chmod(0o755)
    return root


def remove_root(root: Path) -> None:
    """Delete a userland made by make_debian13_root (and its parent), never across mounts."""
    mounted = subprocess.run(
        ["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True, check=False
    ).stdout.split()
    if any(m.startswith(str(root.parent) + "/") for m in mounted):
        raise AssertionError(f"something is still mounted under {root.parent}")
    subprocess.run(["rm", "-rf", "--one-file-system", str(root.parent)], check=False)


# How a program is isolated in the userland: how its /proc/PID/maps paths read from here.
CHROOT = "chroot"  # our mount namespace: paths from our root ("/var/tmp/.../usr/bin/xz")
NS_CHROOT = "ns+chroot"  # own mount namespace, chroot: the namespace's paths, ours too
# own mount namespace, pivot_root: paths from its root ("/usr/bin/xz"). pivot_root
# needs our own root to be a mount's root: so it is on a host, and in the
# userland of tools/debian13.sh, which bind-mounts it onto itself.
CONTAINER = "container"
ISOLATIONS = (CHROOT, NS_CHROOT, CONTAINER)

_CLONE_NEWNS = 0x00020000
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 0x40000
_MNT_DETACH = 2
_SYS_PIVOT_ROOT = 155  # x86-64; glibc has no wrapper


def popen_in(
    root: Path,
    user: str,
    argv: Sequence[str],
    isolation: str = CHROOT,
    env: Mapping[str, str] | None = None,
    **popen_kwargs: Any,
) -> subprocess.Popen[Any]:
    """Run argv (paths as seen inside root) in root, as user, no capabilities.

    Called as root: enter root as `isolation` says, then drop to the user's
    uid and gid with no supplementary groups; setuid from root clears every
    capability. The program's exec makes it dumpable again, as any user's
    own process.
    """
    uid, gid = ensure_user(user)
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork

    def call(result: int) -> None:
        if result != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))

    def enter() -> None:
        if isolation != CHROOT:
            call(libc.unshare(_CLONE_NEWNS))
            call(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None))
        if isolation == CONTAINER:
            call(libc.mount(bytes(root), bytes(root), None, _MS_BIND | _MS_REC, None))
            os.chdir(root)
            call(libc.syscall(_SYS_PIVOT_ROOT, b".", b"."))  # old root stacked on the new
            call(libc.umount2(b".", _MNT_DETACH))
        else:
            os.chroot(root)
        os.chdir("/")
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    full_env = {**CHROOT_ENV, **(env or {})}
    return subprocess.Popen(list(argv), env=full_env, preexec_fn=enter, **popen_kwargs)


def user_dir_in(root: Path, user: str, name: str) -> Path:
    """A fresh directory /tmp/NAME inside root owned by user; its path outside."""
    d = root / "tmp" / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    os.chown(d, *ensure_user(user))
    return d
