"""The pure core: no I/O. Entries, the session value, lineage, token counting, projection."""
