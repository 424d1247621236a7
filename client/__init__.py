"""gfxbpf.client: the library a tool uses, and the gfxclient command."""
