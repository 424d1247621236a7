"""BPF objects the broker runs for itself: never in the catalog, never attached
for a client (tools/build_bpf.py builds and checks them)."""
