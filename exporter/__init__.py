"""gfxbpf.exporter: the broker's maps as Prometheus metrics (gfxbpf-exporter).

A client of the broker like gfxclient: it imports gfxbpf.client (and the
prometheus-client library), never gfxbpf.broker. config.py reads the TOML,
mapping.py turns catalog map roles into metric families, attached.py holds
one broker session and its attachments, collector.py answers each scrape,
main.py is the command.
"""
