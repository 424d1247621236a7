"""How much of a user stack the stack-copy programs (stackcopy, ustackcopy,
offcpu; programs/gfx_ucopy.h) copy. The broker bounds the policy's
max_stack_bytes and a request's size by these, the client its --stack-bytes;
tests/unit/test_stack_bytes.py checks them against the header."""

# The objects' own `stack_bytes` knob: what a sample copies unless the client
# asks for less or the policy caps it (perf --call-graph dwarf's default too).
DEFAULT_STACK_BYTES = 8192
# GFX_COPY_MAX: the most one record holds; above the default only where the
# policy entry's max_stack_bytes says so (twice the bytes a sample in the ring).
MAX_STACK_BYTES = 16384
