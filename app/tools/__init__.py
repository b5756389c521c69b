"""Tools a run can call: the registry of built-ins, and execution bounded by timeouts."""

# Built-ins that live in modules of their own register when imported; importing them here (they
# import app.tools.registry, never the reverse) registers them whenever any tool code is loaded.
from app.tools import calculator, memory, tool_output  # noqa: F401
