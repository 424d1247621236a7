"""Checking the project's TOML files (the catalog, the policy, the exporter's
configuration) with one toolkit: gfxbpf.tomlcheck.checks."""
