"""gfxbpf.client.profiles.engine: take a profile through the broker.

    from gfxbpf.client.profiles.engine.request import ProfileRequest
    from gfxbpf.client.profiles.engine.take import take_profile

    req = ProfileRequest(pids=[1234], command=[])
    taken = take_profile(req, Broker.connect, stop, duration=10.0)
    write_profile(taken.profile, "svg", "cpu.svg")

One call attaches the program the request needs (`request.py`, `attach.py`),
runs `-- COMMAND` held before exec until the attach is live (`child.py`),
captures the targets' /proc/PID/maps while they live (`snapshots.py`), reads
and unwinds what the kernel sends (`run.py`, `sampling.py`, `readers.py`)
and names the stacks (`naming.py`). `live.py`'s `open_profile()` keeps the
same profile open to be read while it runs (`watch cuda --by-python` reads
one every interval). `gfxclient profile` and `watch cuda --by-python` are
its users; what they print is theirs.

This package imports nothing until a module is asked for: the command's
parser imports only `request.py`.
"""
