"""Attach points: perf events, tracefs, kprobes/uprobes/tracepoints/links, USDT."""
