"""The README's commands work as written on a fresh clone, where nothing is activated.

Every shell command of README.md (bash blocks, indented blocks, commands quoted in the prose) is
collected. None may rely on an activated environment (a bare ``python`` finds no torch on a
fresh clone), each ``make`` target must exist, and each ``.venv/bin/python -m ...`` command runs
in its cheap form (``--help`` of the same module and subcommand) with a PATH that holds no
virtual environment, from the repository root.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

#: How a command begins, for the prose's inline code spans (a bare word like `python` is no command).
COMMAND_START = re.compile(r"^(make|\.venv/bin/\S+|python3?|pip3?|pytest|jupyter|bash|conda)\s")


def readme_commands(text: str) -> list[str]:
    """The shell commands of a README: fenced ``bash``/``sh`` blocks, indented blocks, and inline
    code spans that start like a command. Comments and blank lines dropped. A paragraph that
    says ``conda activate`` is left out: its commands run in the conda environment
    (tests/test_environment.py checks that environment.yml matches pyproject.toml)."""
    commands, block, prose = [], None, []
    lines = text.splitlines() + [""]
    for i, line in enumerate(lines):
        fence = re.match(r"^```(\w*)", line)
        if fence:
            block = None if block is not None else fence[1]
            continue
        if block is not None:
            if block in ("bash", "sh", "shell"):
                commands.append(line)
        elif line.startswith("    ") and line.strip() and (not prose or not prose[-1].strip()):
            commands.append(line)                              # an indented code block
            prose.append("")
        elif line.strip():
            prose.append(line)
        else:                                                  # a paragraph ends: its inline commands
            paragraph = " ".join(prose)
            if "conda activate" not in paragraph:
                commands.extend(span for span in re.findall(r"`([^`]+)`", paragraph)
                                if COMMAND_START.match(span))
            prose = [""]
    out = []
    for command in commands:
        command = re.sub(r"\s+#.*$", "", command).strip()
        if command and not command.startswith("#"):
            out.append(command)
    return out


def test_the_extractor_finds_commands_where_readmes_put_them():
    text = ("Run\n\n```bash\nmake lab     # open it\n# a comment\n.venv/bin/python -m x y --z 1\n```\n\n"
            "```python\nimport x\n```\n\nthen `python -m a b` or `make` and `python`:\n\n    make test-browser\n\n"
            "Conda: `conda env create`, `conda activate x`,\nthen `jupyter lab`.\n")
    assert readme_commands(text) == ["make lab", ".venv/bin/python -m x y --z 1", "python -m a b", "make test-browser"]


COMMANDS = readme_commands(README.read_text())


def test_the_readme_has_commands():
    assert {"make lab", "make test", "make test-browser"} <= set(COMMANDS)
    assert any(c.startswith(".venv/bin/python -m moe_tutorial bench") for c in COMMANDS)


@pytest.mark.parametrize("command", sorted(set(COMMANDS)))
def test_no_command_needs_an_activated_environment(command):
    """On a fresh clone ``python`` is the system's, without torch: name the venv's, or use make."""
    first = shlex.split(command)[0]
    if first == "conda":
        return                              # conda's own commands create and activate its environment
    assert first == "make" or first.startswith(".venv/bin/"), \
        f"{command!r}: expected a make target or .venv/bin/..., so that it works without activating .venv"


def clean_env() -> dict:
    """This process's environment without any virtual environment on PATH: a fresh shell."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH", "CONDA_PREFIX")}
    venvs = {str(Path(sys.prefix) / "bin"), str(REPO / ".venv" / "bin")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p not in venvs)
    return env


def cheap_form(command: str) -> list[str]:
    """``.venv/bin/python -m MODULE [SUBCOMMAND] ...`` as ``... -m MODULE [SUBCOMMAND] --help``."""
    words = shlex.split(command)
    assert words[1] == "-m", f"{command!r}: expected .venv/bin/python -m MODULE ..."
    keep = words[:3]
    for word in words[3:]:
        if not re.fullmatch(r"[a-z][a-z0-9_-]*", word):
            break
        keep.append(word)
    return keep + ["--help"]


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.startswith(".venv/bin/python")])
def test_venv_python_commands_run(command):
    if not (REPO / ".venv" / "bin" / "python").exists():
        pytest.skip("no .venv here: `make setup` creates it (`make test` does it first)")
    argv = cheap_form(command)
    result = subprocess.run(argv, cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{' '.join(argv)} failed:\n{result.stdout}\n{result.stderr}"
    assert "usage:" in result.stdout


@pytest.mark.parametrize("command", sorted({c for c in COMMANDS if c.startswith("make")}))
def test_make_targets_exist(command):
    """``make -n`` prints what a target would run, and fails for a target that does not exist."""
    result = subprocess.run(shlex.split(command) + ["-n"], cwd=REPO, env=clean_env(), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, f"{command} -n failed:\n{result.stdout}\n{result.stderr}"
