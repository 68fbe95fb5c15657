"""Settings.history_window_s: how old a line in a log read for the first time may be and still be news."""

from __future__ import annotations

import pytest

from core.errors import ConfigError
from core.settings import load_settings


def test_the_default_window_is_fifteen_minutes() -> None:
    assert load_settings().history_window_s == 900.0


def test_the_window_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARGUS_HISTORY_WINDOW_S", "3600")
    assert load_settings().history_window_s == 3600.0


@pytest.mark.parametrize("value", [0, -5, "soon"])
def test_a_window_that_is_not_a_positive_number_names_the_setting(value: object) -> None:
    with pytest.raises(ConfigError, match="history_window_s"):
        load_settings(history_window_s=value)
