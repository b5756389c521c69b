"""The Hypothesis profile tests/conftest.py loads: a slow example on a loaded machine is no bug."""

from __future__ import annotations

from hypothesis import HealthCheck, settings


def test_the_loaded_profile_has_no_deadline_and_allows_slow_examples() -> None:
    loaded = settings.default
    assert loaded is not None
    assert loaded.deadline is None
    assert HealthCheck.too_slow in loaded.suppress_health_check


def test_a_tests_own_settings_keep_what_the_profile_sets() -> None:
    # What @settings(max_examples=...) on a test builds: it inherits the rest from the profile.
    own = settings(max_examples=7)
    assert own.deadline is None
    assert HealthCheck.too_slow in own.suppress_health_check
