"""gfxclient: the command line and its screens over the client library."""
