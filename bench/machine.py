"""What the figures were measured on, and which peers could run."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.harness import REPO


def _first_line(argv: list[str]) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except OSError as e:
        return f"not available ({e.strerror})"
    return (r.stdout or r.stderr).strip().splitlines()[0] if (r.stdout or r.stderr) else ""


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _mem_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 2**20, 1)
    return 0.0


def bcc_status() -> str:
    """BCC compiles its C at run time against the running kernel's headers:
    from /lib/modules/<release>/build, or the kheaders module's tarball."""
    build = Path(f"/lib/modules/{platform.release()}/build")
    kheaders = Path("/sys/kernel/kheaders.tar.xz")
    if not build.exists() and not kheaders.exists():
        return (
            f"not measured: BCC cannot run here. It compiles its programs against the "
            f"running kernel's headers, and this kernel ({platform.release()}) has neither "
            f"{build} nor {kheaders} (CONFIG_IKHEADERS)."
        )
    return "kernel headers present, but BCC is not part of this bench"


def describe() -> dict[str, Any]:
    commit = _first_line(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    return {
        "kernel": platform.release(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "memory_gib": _mem_gib(),
        "python": platform.python_version(),
        "gfxbpf": metadata.version("gfxbpf"),
        "commit": commit,
        "bpftrace": _first_line(["bpftrace", "--version"]),
        "bpftool": _first_line(["bpftool", "version"]),
        "bcc": bcc_status(),
    }
