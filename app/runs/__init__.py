"""The run aggregate: its states and transitions (its events: app/eventlog/registry.py)."""
