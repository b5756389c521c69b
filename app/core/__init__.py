"""The pure core: no I/O. Entries, the session and run values, usage, lineage, token counting,
projection."""
