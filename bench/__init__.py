"""bench/: gfxbpf measured against bpftrace and bpftool (run with bench/run)."""
