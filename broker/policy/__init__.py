"""The policy: its data model, the TOML file format, decisions, and --check-policy reports."""
