"""The static audit of objects before they load, and the cache of approved bytes and verdicts."""
