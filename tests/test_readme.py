"""The README's commands work as written on a fresh clone, where nothing is activated.

Every shell command of README.md and of the docs pages it sends readers to for commands
(docs/measuring.md, docs/testing.md), in bash blocks, indented blocks or quoted in the prose, is
collected. None may rely on an activated environment (a bare ``python`` finds no torch on a
fresh clone), each ``make`` target must exist (``make -n``), and each ``.venv/bin/python -m moe_tutorial...``
command runs as written, through bash, with a PATH that holds no virtual environment, from a
folder laid out like the repository root: on a CPU ``bench`` runs its toy shape, the grading line
grades ``notebooks/exercises/submissions/example.ipynb``, and the GPU-only ``tune`` must refuse, saying why. On a GPU,
where ``bench`` and ``tune`` would run for an hour, those two run their ``--help``.
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
#: The pages whose commands a reader runs: the README's first screens, then every command of the
#: bench and the tuner, and what ``make test`` runs.
PAGES = (README, REPO / "docs" / "measuring.md", REPO / "docs" / "testing.md")

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


COMMANDS = [c for page in PAGES for c in readme_commands(page.read_text())]


def test_the_readme_has_commands():
    first = readme_commands(README.read_text())
    assert {"make lab", "make test"} <= set(first) and "make test-browser" in COMMANDS
    assert any(c.startswith(".venv/bin/python -m moe_tutorial bench") for c in first)
    assert any(c.startswith(".venv/bin/python -m moe_tutorial tune") for c in COMMANDS)


def test_the_readme_links_the_pages_it_leaves_details_to():
    text = README.read_text()
    for page in PAGES[1:] + (REPO / "docs" / "results.md", REPO / "docs" / "ARCHITECTURE.md"):
        assert f"(docs/{page.name})" in text, page.name


@pytest.mark.parametrize("command", sorted(set(COMMANDS)))
def test_no_command_needs_an_activated_environment(command):
    """On a fresh clone ``python`` is the system's, without torch: name the venv's, or use make."""
    first = shlex.split(command)[0]
    assert first == "make" or first.startswith(".venv/bin/"), \
        f"{command!r}: expected a make target or .venv/bin/..., so that it works without activating .venv"


def test_the_conda_lines_say_what_jupyter_needs_as_root():
    """The conda paragraph's commands run in the conda environment, so they are not collected
    above; what they must say is checked here: `jupyter lab` refuses to start as root without
    --allow-root (make lab adds it)."""
    paragraph = next(p for p in README.read_text().split("\n\n") if "conda env create" in p)
    assert "`conda env create -f environment.yml && conda activate moe-tutorial`" in paragraph
    assert "`jupyter lab notebooks/`" in paragraph and "`--allow-root`" in paragraph and "root" in paragraph
    assert "conda env create" not in " ".join(COMMANDS)


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


def test_cheap_form_keeps_the_module_and_subcommand():
    assert cheap_form(".venv/bin/python -m moe_tutorial tune --E 40") == \
        [".venv/bin/python", "-m", "moe_tutorial", "tune", "--help"]


#: Subcommands that need a CUDA GPU: on a CPU they must refuse, saying so.
GPU_ONLY = {"tune"}
#: Subcommands that run for an hour on a GPU: there only their --help runs.
LONG_ON_A_GPU = {"bench", "tune"}


def subcommand(command: str) -> str:
    words = shlex.split(command)
    return words[3] if len(words) > 3 and words[2] == "moe_tutorial" else ""


def run_as_written(command: str, where: Path) -> subprocess.CompletedProcess:
    """``command`` through bash (globs expand as a shell expands them) in ``where``, which holds
    the repository's ``.venv`` and ``notebooks`` (links), so that what it writes stays there."""
    for name in (".venv", "notebooks"):
        (where / name).symlink_to(REPO / name)
    return subprocess.run(["bash", "-c", command], cwd=where, env=clean_env(), capture_output=True, text=True,
                          timeout=540)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("command", sorted({c for c in COMMANDS if c.startswith(".venv/bin/python -m moe_tutorial")}))
def test_venv_python_commands_run_as_written(command, tmp_path):
    if not (REPO / ".venv" / "bin" / "python").exists():
        pytest.skip("no .venv here: `make setup` creates it (`make test` does it first)")
    from moe_tutorial import runtime

    sub = subcommand(command)
    if runtime.ON_GPU and sub in LONG_ON_A_GPU and "--help" not in command:
        command = shlex.join(cheap_form(command))
    result = run_as_written(command, tmp_path)
    out = result.stdout + result.stderr
    assert "Traceback" not in out, f"{command}:\n{out[-4000:]}"
    if sub in GPU_ONLY and not runtime.ON_GPU and "--help" not in command:
        assert result.returncode != 0 and "no CUDA GPU" in out and "nothing to tune here" in out, out[-3000:]
        return
    assert result.returncode == 0, f"{command} failed:\n{out[-4000:]}"
    if "--help" in command:
        assert "usage:" in result.stdout
    elif sub == "bench":
        assert "M=1 ms" in result.stdout and (tmp_path / "moe_bench" / "bench.csv").stat().st_size > 0, out[-3000:]
    elif "exercises.grade" in command:
        row = [line.split() for line in result.stdout.splitlines() if line.startswith("example ")]
        assert row == [["example", "PASS", "todo", "todo", "todo", "1/4"]], out[-3000:]
    elif "exercises.release" in command:
        folder = tmp_path / shlex.split(command)[-1]
        assert (folder / "notebooks" / "exercises" / "part1_exercises.ipynb").exists(), out[-3000:]
        assert not list(folder.rglob("*_solutions.ipynb")), "a release holds no solutions"
    else:
        raise AssertionError(f"{command!r}: this test does not know what the command should print; teach it")


@pytest.mark.parametrize("command", sorted({c for c in COMMANDS if c.startswith("make")}))
def test_make_targets_exist(command):
    """``make -n`` prints what a target would run, and fails for a target that does not exist."""
    result = subprocess.run(shlex.split(command) + ["-n"], cwd=REPO, env=clean_env(), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, f"{command} -n failed:\n{result.stdout}\n{result.stderr}"
