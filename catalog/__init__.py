"""The catalog layer: the approved programs (catalog.toml, programs/), their
function tables, and running one (docs/ARCHITECTURE.md)."""
