"""The worker pool: procrastinate jobs that execute runs and stream their events."""
