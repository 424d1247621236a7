"""python -m gfxbpf.client: the gfxclient command."""

from gfxbpf.client.cli.gfxclient import run

run()
