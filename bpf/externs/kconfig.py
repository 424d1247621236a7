"""Values for `.kconfig` externs: the running kernel's config and version.

An object may declare `extern int LINUX_KERNEL_VERSION __kconfig;` or
`extern bool CONFIG_X __kconfig __weak;`; libbpf fills them from the kernel's
build config and uname, and so does gfxbpf. The config is read from
/boot/config-$(uname -r) or /proc/config.gz; the virtual LINUX_* values are
computed here. Encoding a value into the extern's C type is in decls.py.
"""

from __future__ import annotations

import functools
import gzip
import os
import platform
import re
import zlib

PROC_CONFIG = "/proc/config.gz"
MAX_CONFIG_BYTES = 16 << 20  # a kernel config is a few hundred KiB

_LINE = re.compile(r"^(CONFIG_[A-Za-z0-9_]+)=(.*)$")
_RELEASE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")


class KconfigError(ValueError):
    """The kernel config could not be read or a value does not fit its extern."""


def kernel_version(release: str | None = None) -> int:
    """KERNEL_VERSION(major, minor, patch) of a release string, as libbpf computes it."""
    rel = release if release is not None else platform.release()
    m = _RELEASE.match(rel)
    if m is None:
        raise KconfigError(f"cannot parse the kernel release {rel!r} as major.minor.patch")
    major, minor, patch = int(m[1]), int(m[2]), int(m[3] or 0)
    return (major << 16) + (minor << 8) + min(patch, 255)


def parse_config(text: str) -> dict[str, str]:
    """CONFIG_* assignments of a kernel .config ('# ... is not set' lines are absent)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m is not None:
            out[m[1]] = m[2]
    return out


def _read_config_text(release: str) -> tuple[str, str]:
    """(text, where it came from): /boot/config-<release> first, then /proc/config.gz."""
    boot = f"/boot/config-{release}"
    tried = []
    for path in (boot, PROC_CONFIG):
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_CONFIG_BYTES + 1)
            if path.endswith(".gz"):
                raw = gzip.decompress(raw)
            return raw[:MAX_CONFIG_BYTES].decode("utf-8", "replace"), path
        except (OSError, EOFError, zlib.error) as e:
            tried.append(f"{path}: {getattr(e, 'strerror', None) or e}")
    raise KconfigError(
        "cannot read the kernel config for .kconfig externs (" + "; ".join(tried) + "): "
        "install it as /boot/config-$(uname -r) or build the kernel with CONFIG_IKCONFIG_PROC"
    )


@functools.lru_cache(maxsize=1)
def running_config() -> tuple[dict[str, str], str]:
    """The running kernel's config and the file it was read from."""
    text, where = _read_config_text(platform.release())
    return parse_config(text), where


def virtual_value(name: str) -> str | None:
    """libbpf's computed externs, as config-style strings; None for other names."""
    if name == "LINUX_KERNEL_VERSION":
        return str(kernel_version())
    if name == "LINUX_HAS_BPF_COOKIE":  # bpf_get_attach_cookie: Linux 5.15
        return "y" if kernel_version() >= (5 << 16) + (15 << 8) else "n"
    if name == "LINUX_HAS_SYSCALL_WRAPPER":  # x86-64 __x64_sys_* wrappers: Linux 4.17
        return "y" if os.uname().machine == "x86_64" else "n"
    return None


def lookup(name: str) -> tuple[str | None, str]:
    """(value or None if unset, source) of one .kconfig extern on the running kernel."""
    if name.startswith("LINUX_"):
        return virtual_value(name), "computed"
    config, where = running_config()
    return config.get(name), where
