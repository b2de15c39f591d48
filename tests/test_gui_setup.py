"""The set-up the README promises: CI runs its test command, and the browser installer is safe to rerun."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_ci_runs_the_readme_test_command_and_the_first_command_serves_the_studio():
    commands = readme_commands()
    assert commands[0] == 'pip install -e ".[demo]" && panel serve app.py --address localhost'
    test_command = next(c for c in commands if "pytest" in c)
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == [test_command]
    assert "scripts/install-browser" in test_command


@pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium on PATH")
def test_install_browser_does_nothing_when_chromium_is_there():
    out = subprocess.run([str(ROOT / "scripts" / "install-browser")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"chromium: {shutil.which('chromium')}"


def test_install_browser_explains_what_to_do_without_apt(tmp_path):
    bash = shutil.which("bash")
    # A PATH with neither a browser nor apt-get: the script must say so and not fail the set-up.
    out = subprocess.run([bash, str(ROOT / "scripts" / "install-browser")], capture_output=True, text=True,
                         timeout=60, env={"PATH": str(tmp_path)})
    assert out.returncode == 0
    assert "No Chromium found" in out.stderr and "MPSTUDIO_CHROMIUM" in out.stderr
