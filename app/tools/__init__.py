"""Tools a run can call: the registry of built-ins, and execution bounded by timeouts."""
