"""How much of a user stack the stack-copy programs (stackcopy, ustackcopy,
offcpu; programs/gfx_ucopy.h) copy. The broker bounds the policy's
max_stack_bytes and a request's size by these, the client its --stack-bytes;
tests/unit/test_stack_bytes.py checks them against the header."""

# The objects' own `stack_bytes` knob: what a sample copies unless the client
# asks for less or the policy caps it (perf --call-graph dwarf's default too).
DEFAULT_STACK_BYTES = 8192
# GFX_COPY_MAX: the most one record holds; above the default only where the
# policy entry's max_stack_bytes says so. 24 KiB: the record and its page of
# slack fill a per-CPU scratch slot, whose values the kernel caps at 32 KiB.
MAX_STACK_BYTES = 24576
# What `gfxbpf-admin approve` writes as max_stack_bytes when the administrator
# names none, per program: the whole copy for CPU samples and probes (a PyTorch
# training step's stacks are 13-20 KiB deep: docs/ARCHITECTURE.md has the
# figures), the object's default for offcpu, which copies at every wait.
APPROVED_STACK_BYTES = {
    "stackcopy": MAX_STACK_BYTES,
    "ustackcopy": MAX_STACK_BYTES,
    # its launch copies are taken under CUPTI's callback frames: 8 KiB stopped
    # inside libcupti for every launch on an H200 (docs/gpu-hosts.md)
    "cudakernels": MAX_STACK_BYTES,
    "memstacks": MAX_STACK_BYTES,
}
