"""Use cases: one async function each, owning its transaction."""
