"""A load that fails part-way leaves nothing behind, and says why."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gfxbpf.bpf.loader import LoadError, load
from gfxbpf.bpf.object import ObjectSpec
from tests.conftest import compile_bpf

SOURCE = """
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 8);
         __type(key, __u32); __type(value, __u64); } counts SEC(".maps");
const volatile __u32 knob = 1;
SEC("raw_tracepoint/sys_enter") int good(void *ctx) {
    __u32 k = knob; __u64 one = 1;
    bpf_map_update_elem(&counts, &k, &one, BPF_ANY);
    return 0;
}
SEC("raw_tracepoint/sys_exit") int bad(void *ctx) {
    __u32 k = 0; __u64 *v = bpf_map_lookup_elem(&counts, &k);
    return *v;   /* no NULL check: the verifier refuses this */
}
char LICENSE[] SEC("license") = "GPL";
"""


def fds() -> set[str]:
    """This process's BPF object fds (maps, programs, BTF), by fd number."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(("anon_inode:bpf", "anon_inode:btf")):
            out.add(fd)
    return out


def test_rejected_program_unloads_everything(tmp_path: Path) -> None:
    obj = compile_bpf(SOURCE, tmp_path, "half")
    spec = ObjectSpec.from_file(str(obj))
    before = fds()
    with pytest.raises(LoadError) as ei:
        load(spec)
    assert "refused program 'bad'" in str(ei.value)
    assert ei.value.log and "invalid mem access" in ei.value.log
    assert fds() == before  # maps, BTF and the first program were all closed
    # Loading only the good program works.
    with load(spec, programs=["good"]) as ok:
        assert set(ok.programs) == {"good"}
