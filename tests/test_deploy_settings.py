"""DEBUG is off unless asked for, and the production settings pass Django's deployment checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PRODUCTION = {"SECRET_KEY": "x" * 60 + "-not-the-development-key", "ALLOWED_HOSTS": "kb.example.org",
              "CSRF_TRUSTED_ORIGINS": "https://kb.example.org"}


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in {"DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "DJANGO_SETTINGS_MODULE"}}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env={**clean, **env},
                          capture_output=True, text=True, timeout=120)


def test_debug_defaults_off_and_then_demands_a_secret_key():
    result = manage("check")
    assert result.returncode != 0 and "SECRET_KEY must be set when DEBUG is off" in result.stderr
    result = manage("shell", "-c", "from django.conf import settings; print(settings.DEBUG)", **PRODUCTION)
    assert result.returncode == 0 and result.stdout.strip().splitlines()[-1] == "False"


def test_check_deploy_is_clean_with_the_documented_production_settings():
    result = manage("check", "--deploy", "--fail-level", "WARNING", **PRODUCTION)
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout
