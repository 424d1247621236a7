"""Per-user accounting: gRPC tokens and leases, counts per uid, the map-memory budget."""
