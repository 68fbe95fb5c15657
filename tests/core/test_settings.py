from pathlib import Path

import pytest

from core.errors import ConfigError
from core.settings import load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    import os

    for key in list(os.environ):
        if key.startswith("ARGUS_"):
            monkeypatch.delenv(key)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "argus.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_validate_and_default_to_sqlite(tmp_path):
    s = load_settings(data_dir=tmp_path)
    assert s.effective_database_url == f"sqlite:///{tmp_path / 'argus.db'}"
    assert s.ray_dashboard_url.startswith("http://")


def test_file_then_env_then_overrides(tmp_path, monkeypatch):
    path = write(tmp_path, "poll_interval_s: 7\nray_dashboard_url: http://head:8265/\nlog_level: debug\n")
    s = load_settings(path)
    assert s.poll_interval_s == 7 and s.ray_dashboard_url == "http://head:8265" and s.log_level == "DEBUG"
    monkeypatch.setenv("ARGUS_POLL_INTERVAL_S", "3")
    assert load_settings(path).poll_interval_s == 3
    assert load_settings(path, poll_interval_s=1).poll_interval_s == 1


def test_config_path_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("ARGUS_CONFIG", str(write(tmp_path, "api_port: 9001\n")))
    assert load_settings().api_port == 9001


def test_bad_yaml_names_file_and_line(tmp_path):
    path = write(tmp_path, "api_port: 9001\nwebhook_urls: [http://x\n  bad: : :\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert str(path) in info.value.message and "line" in info.value.message


def test_wrong_type_names_field_source_and_value(tmp_path):
    path = write(tmp_path, "poll_interval_s: often\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    msg = info.value.message
    assert "poll_interval_s" in msg and str(path) in msg and "'often'" in msg
    assert info.value.hint


def test_env_error_names_the_variable(monkeypatch):
    monkeypatch.setenv("ARGUS_API_PORT", "99999")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "ARGUS_API_PORT" in info.value.message


def test_unknown_key_lists_known_ones(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, "ray_adress: http://x:8265\n"))
    assert "ray_adress" in info.value.message and "ray_dashboard_url" in info.value.hint


@pytest.mark.parametrize(
    "text",
    ["- a\n- b\n", "just a string\n", "42\n"],
)
def test_not_a_mapping(tmp_path, text):
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_settings(write(tmp_path, text))


def test_empty_file_is_defaults(tmp_path):
    assert load_settings(write(tmp_path, "")).api_port == 8600


def test_missing_file_and_binary_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.yaml")
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="UTF-8"):
        load_settings(bad)


def test_urls_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="ray_dashboard_url"):
        load_settings(write(tmp_path, "ray_dashboard_url: head:8265\n"))
    with pytest.raises(ConfigError, match="webhook_urls"):
        load_settings(write(tmp_path, "webhook_urls: ['ftp://x']\n"))


def test_huge_value_is_shortened_in_the_message(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, f"log_level: {'x' * 100_000}\n"))
    assert len(info.value.message) < 500
