"""Memory profiles (`gfxclient profile --memory`): which library the program
memstacks probes in the target (`library.py`), and the bytes of its rows as
stacks (`stacks.py`). The profiling engine attaches and reads it as it does
`--stacks-at` (docs/ARCHITECTURE.md, "Memory by stack")."""
