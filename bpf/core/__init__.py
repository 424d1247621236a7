"""CO-RE: relocation records resolved against a target BTF and patched into
instructions, as libbpf does."""
