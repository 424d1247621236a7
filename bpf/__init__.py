"""gfxbpf.bpf: everything that speaks BPF, with no policy.

Object parsing (no syscalls), the loader, attach points, map access, the
ring-buffer reader and the instruction decoder. Layers: docs/ARCHITECTURE.md.
"""
