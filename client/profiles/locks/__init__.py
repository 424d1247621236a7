"""`gfxclient profile --locks`: user-space lock contention per futex word
(program `locks`), each lock named by the symbol of its variable, its waiters'
stacks and the stacks of the threads that released it (names.py, reader.py,
shape.py)."""
