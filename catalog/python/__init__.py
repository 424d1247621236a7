"""CPython's memory layout per release, for the BPF Python frame walker
(issue 23): what the broker loads into py_layouts (layouts.py)."""
