import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from moeops.settings import database_from_url, envbool, envint


def test_envbool_reads_true_and_false(monkeypatch):
    monkeypatch.setenv("X_FLAG", "yes")
    assert envbool("X_FLAG", False) is True
    monkeypatch.setenv("X_FLAG", "0")
    assert envbool("X_FLAG", True) is False


def test_envbool_rejects_garbage(monkeypatch):
    monkeypatch.setenv("X_FLAG", "maybe")
    with pytest.raises(ImproperlyConfigured, match="X_FLAG"):
        envbool("X_FLAG", False)


def test_envint_rejects_non_integers(monkeypatch):
    monkeypatch.setenv("X_INT", "12MB")
    with pytest.raises(ImproperlyConfigured, match="X_INT"):
        envint("X_INT", 1)


def test_it_parses_postgres_urls():
    db = database_from_url("postgres://alice:s%40cret@db.local:6543/moe")
    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert (db["USER"], db["PASSWORD"], db["HOST"], db["PORT"], db["NAME"]) == (
        "alice",
        "s@cret",
        "db.local",
        "6543",
        "moe",
    )


def test_it_rejects_unknown_database_schemes():
    with pytest.raises(ImproperlyConfigured, match="mysql"):
        database_from_url("mysql://root@127.0.0.1/x")


def _check_deploy(env):
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        env={
            "PATH": "/usr/bin:/bin",
            "DJANGO_SETTINGS_MODULE": "moeops.settings_production",
            **env,
        },
        capture_output=True,
        text=True,
    )


def test_production_settings_pass_check_deploy():
    result = _check_deploy(
        {
            "SECRET_KEY": "x" * 60 + "-long-and-random-enough-9f8e7d",
            "ALLOWED_HOSTS": "moeops.example",
        }
    )
    assert result.returncode == 0, result.stderr + result.stdout


def test_production_settings_refuse_to_start_without_a_secret_key():
    result = _check_deploy({"ALLOWED_HOSTS": "moeops.example"})
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr
