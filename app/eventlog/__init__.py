"""The run event log: its registry of event types, its writer, its storage and its fan-out hub."""
