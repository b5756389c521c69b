"""The run aggregate: its states, transitions and events (the registry of run event types)."""
