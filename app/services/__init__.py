"""Use cases: one async function each, owning its transaction (run_transitions holds the steps
they and the worker apply inside one: a run's transitions)."""
