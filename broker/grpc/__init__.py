"""The broker's gRPC listener: authentication, slots, the servicer and its methods."""
