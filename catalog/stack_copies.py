"""How much of a user stack the stack-copy programs (stackcopy, ustackcopy,
offcpu, memstacks, cudakernels; programs/gfx_ucopy.h, gfx_udeep.h) copy.
The broker bounds the policy's max_stack_bytes and a request's size by
these, the client its --stack-bytes; tests/unit/test_stack_bytes.py checks
them against the headers."""

# The objects' own `stack_bytes` knob: what a sample copies unless the client
# asks for less or the policy caps it (perf --call-graph dwarf's default too).
DEFAULT_STACK_BYTES = 8192
# GFX_COPY_MAX: the most one record built in the per-CPU scratch holds; above
# the default only where the policy entry's max_stack_bytes says so. 24 KiB:
# the record and its page of slack fill a scratch slot, whose values the
# kernel caps at 32 KiB.
MAX_STACK_BYTES = 24576
# GFX_DEEP_COPY_MAX: cudakernels reserves its rare launch copies in its ring
# (gfx_udeep.h), so they are not held to the scratch's size. 72 KiB: a
# cuBLASLt launch sits 68-70 KiB below the stack's top on an H200
# (docs/gpu-hosts.md).
DEEP_STACK_BYTES = 73728
_MOST = {"cudakernels": DEEP_STACK_BYTES}
# The most any program copies: what --stack-bytes accepts (the broker then
# holds each request to its program's own most).
LARGEST_STACK_BYTES = max(MAX_STACK_BYTES, *_MOST.values())


def most_stack_bytes(program: str) -> int:
    """The most one copy of this catalog program holds (a policy's
    max_stack_bytes or a request above it is refused)."""
    return _MOST.get(program, MAX_STACK_BYTES)


# What `gfxbpf-admin approve` writes as max_stack_bytes when the administrator
# names none, per program: the whole copy for CPU samples and probes (a PyTorch
# training step's stacks are 13-20 KiB deep: docs/ARCHITECTURE.md has the
# figures), the object's default for offcpu, which copies at every wait.
APPROVED_STACK_BYTES = {
    "stackcopy": MAX_STACK_BYTES,
    "ustackcopy": MAX_STACK_BYTES,
    # its launch copies are taken under CUPTI's callback frames, and cuBLASLt
    # launches 68-70 KiB deep (docs/gpu-hosts.md); copies are a chain's 1st,
    # 2nd, 4th ... launch, sized to the stack that exists
    "cudakernels": DEEP_STACK_BYTES,
    "memstacks": MAX_STACK_BYTES,
}
