"""Real registers and stack copies for the unwinder's tests and benchmark, taken
the way the BPF program takes them but without BPF: an LD_PRELOAD library
whose SIGPROF handler (ITIMER_PROF, every period of CPU time) writes the
interrupted rip, rsp, rbp and up to 8 KiB of the stack from rsp upward, like
perf --call-graph dwarf; at exit it writes /proc/self/maps. Works for any
dynamically linked program (Debian's python3 and xz included), as any user.
"""

from __future__ import annotations

import os
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gfxbpf.client.profiles.procmaps import ProcessMaps, parse_maps
from gfxbpf.client.profiles.unwind import UserRegs

SAMPLER_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <ucontext.h>
#include <unistd.h>

static int out_fd = -1;
static uintptr_t stack_lo, stack_hi;
static char maps_path[4200];
static volatile int left;
static size_t copy_max = 8192;  /* UNWIND_STACK_BYTES: the BPF program's cap by default */

/* Async-signal-safe: only write(2). Samples of other threads' stacks are skipped. */
static void on_prof(int sig, siginfo_t *si, void *arg) {
    ucontext_t *uc = arg;
    int saved = errno;
    uint64_t rec[5];
    uintptr_t sp = uc->uc_mcontext.gregs[REG_RSP];
    if (out_fd >= 0 && left > 0 && sp >= stack_lo && sp < stack_hi) {
        size_t n = stack_hi - sp < copy_max ? stack_hi - sp : copy_max;
        rec[0] = 0x53574e55u;  /* "UNWS" */
        rec[1] = uc->uc_mcontext.gregs[REG_RIP];
        rec[2] = sp;
        rec[3] = uc->uc_mcontext.gregs[REG_RBP];
        rec[4] = n;
        if (write(out_fd, rec, sizeof rec) == sizeof rec && write(out_fd, (void *)sp, n) > 0)
            left--;
    }
    errno = saved;
}

static void copy_maps(const char *to) {
    char buf[65536];
    int in = open("/proc/self/maps", O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ssize_t n;
    while (in >= 0 && out >= 0 && (n = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, n) != n) break;
    if (in >= 0) close(in);
    if (out >= 0) close(out);
}

__attribute__((constructor)) static void sampler_start(void) {
    const char *path = getenv("UNWIND_SAMPLES");
    const char *period = getenv("UNWIND_PERIOD_US");
    char line[4200];
    FILE *maps;
    if (!path) return;
    snprintf(maps_path, sizeof maps_path, "%s.maps", path);
    left = getenv("UNWIND_MAX") ? atoi(getenv("UNWIND_MAX")) : 2000;
    if (getenv("UNWIND_STACK_BYTES")) copy_max = strtoul(getenv("UNWIND_STACK_BYTES"), 0, 10);
    maps = fopen("/proc/self/maps", "r");
    while (maps && fgets(line, sizeof line, maps))
        if (strstr(line, "[stack]")) sscanf(line, "%lx-%lx", &stack_lo, &stack_hi);
    if (maps) fclose(maps);
    stack_lo = stack_lo ? stack_lo - (8 << 20) : 0;  /* the stack grows down from its mapping */
    out_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    unsetenv("UNWIND_SAMPLES");  /* not the children's */
    struct sigaction sa = {0};
    sa.sa_sigaction = on_prof;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGPROF, &sa, NULL);
    long us = period ? atol(period) : 997;
    struct itimerval it = {{0, us}, {0, us}};
    setitimer(ITIMER_PROF, &it, NULL);
}

__attribute__((destructor)) static void sampler_stop(void) {
    struct itimerval off = {{0, 0}, {0, 0}};
    if (out_fd < 0) return;
    setitimer(ITIMER_PROF, &off, NULL);
    copy_maps(maps_path);
}
"""

_REC = struct.Struct("<QQQQQ")
_MAGIC = 0x53574E55


@dataclass(frozen=True)
class Sample:
    regs: UserRegs
    stack: bytes


@dataclass
class Capture:
    samples: list[Sample]
    maps: ProcessMaps
    returncode: int


def build_sampler(folder: Path) -> Path:
    src, lib = folder / "sampler.c", folder / "libsampler.so"
    if not lib.exists():
        src.write_text(SAMPLER_C)
        subprocess.run(
            ["gcc", "-O2", "-shared", "-fPIC", "-o", lib, src], check=True, capture_output=True
        )
    return lib


def read_samples(path: Path) -> list[Sample]:
    data = path.read_bytes()
    out, pos = [], 0
    while pos + _REC.size <= len(data):
        magic, ip, sp, bp, n = _REC.unpack_from(data, pos)
        assert magic == _MAGIC, f"corrupt sample file at {pos}"
        pos += _REC.size
        out.append(Sample(UserRegs(ip, sp, bp), data[pos : pos + n]))
        pos += n
    return out


def sample_run(
    argv: list[str],
    folder: Path,
    *,
    period_us: int = 997,
    max_samples: int = 2000,
    stack_bytes: int = 8192,
    stdin: bytes | None = None,
    timeout: float = 120,
) -> Capture:
    """Run argv with the sampler preloaded; its samples and its last maps."""
    lib = build_sampler(folder)
    out = folder / f"samples-{os.getpid()}-{len(list(folder.iterdir()))}"
    env = dict(os.environ, LD_PRELOAD=str(lib), UNWIND_SAMPLES=str(out),
               UNWIND_PERIOD_US=str(period_us), UNWIND_MAX=str(max_samples),
               UNWIND_STACK_BYTES=str(stack_bytes))  # fmt: skip
    proc = subprocess.run(argv, env=env, input=stdin, capture_output=True, timeout=timeout)
    maps_text = Path(f"{out}.maps").read_text()
    # The process is gone: its maps as it last saw them stand for it.
    maps = ProcessMaps(pid=0, mappings=parse_maps(maps_text), comm=Path(argv[0]).name)
    return Capture(read_samples(out), maps, proc.returncode)
