"""The package list, which pyproject.toml cannot state: app's packages as found, plus the
top-level migrations/ directory mapped into the package (pyproject.toml's package-dir), so that
an installed wheel ships the migrations as app/db/migrations (app/db/migrate.py finds them)."""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["app", "app.*"]),
        "app.db.migrations",
        "app.db.migrations.versions",
    ]
)
