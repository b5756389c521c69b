"""The run event log: its event types, writer, storage, fan-out hub and the one stream path."""
