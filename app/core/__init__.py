"""The pure core: no I/O. Entry types, lineage arithmetic, token counting, projection."""
