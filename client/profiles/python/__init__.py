"""Python frames in profiles: finding interpreters, decoding what the BPF walker copied, mixing Python frames into native stacks."""
