"""The running kernel as the loader sees it: its BTF (vmlinux and modules,
read from /sys/kernel/btf and found by bpf(2)) and the BTF kinds its loader
accepts. The pure layers, btf/ and core/, take what these read."""
