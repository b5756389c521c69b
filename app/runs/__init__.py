"""The run aggregate's transitions: what each does to a run and the events it emits (the run's
value: app/core/runs.py; its events: app/eventlog/registry.py)."""
