"""environment.yml gives conda users exactly the pins pyproject.toml gives pip users."""
import re
import sys
from pathlib import Path

import pytest
import yaml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 has no tomllib
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[1]


def make_setup_extras() -> list[str]:
    """The extras ``make setup`` installs, read from the Makefile's ``pip install -e ".[...]"``."""
    found = re.findall(r'pip install [^\n]*-e "\.\[([\w,]+)\]"', (REPO / "Makefile").read_text())
    assert len(found) == 1, f"Makefile: expected one editable install with extras, found {found}"
    return found[0].split(",")


def pyproject_requirements() -> list[str]:
    """``[project] dependencies`` followed by every extra ``make setup`` installs, as written."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return list(project["dependencies"]) + [r for name in make_setup_extras() for r in extras[name]]


def test_make_setup_installs_the_dev_and_browser_extras():
    """`make test` runs pytest (dev) and Playwright (browser): conda users need both too."""
    assert set(make_setup_extras()) >= {"dev", "browser"}


def environment() -> dict:
    return yaml.safe_load((REPO / "environment.yml").read_text())


def conda_and_pip(env: dict) -> tuple[list[str], list[str]]:
    """The conda packages (strings) and the pip section's lines of ``dependencies``."""
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pips = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pips) == 1, "environment.yml: expected one pip section"
    return conda, pips[0]


def test_environment_is_named_and_has_python_and_pip():
    env = environment()
    conda, _ = conda_and_pip(env)
    assert env["name"] == "moe-tutorial"
    assert "pip" in conda
    pythons = [d for d in conda if re.fullmatch(r"python\s*[=<>!~].*", d)]
    assert pythons == ["python=3.11"], pythons


def test_python_pin_satisfies_requires_python():
    minimum = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    low = re.fullmatch(r">=\s*(\d+)\.(\d+)", minimum)
    assert low, f"requires-python: expected '>=X.Y', got {minimum!r}"
    assert (3, 11) >= (int(low[1]), int(low[2]))


def test_pip_section_matches_pyproject():
    """Every requirement string of pyproject appears identically in environment.yml and back."""
    _, pip = conda_and_pip(environment())
    requirements = [line for line in pip if not line.startswith("-")]
    expected = pyproject_requirements()
    missing = [r for r in expected if r not in requirements]
    extra = [r for r in requirements if r not in expected]
    assert not missing and not extra, f"only in pyproject.toml: {missing}; only in environment.yml: {extra}"
    assert len(requirements) == len(set(requirements)), "a requirement listed twice"


def test_pip_section_installs_this_package():
    _, pip = conda_and_pip(environment())
    assert "-e ." in pip


def test_license_is_an_spdx_string_and_the_build_backend_reads_it():
    """A TOML table for ``project.license`` stops building in 2027 (setuptools' deprecation); an
    SPDX expression needs setuptools 77 or later, so the build requirement must say so."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "Apache-2.0"
    floors = [re.fullmatch(r"setuptools>=(\d+)(?:\.\d+)*", r) for r in pyproject["build-system"]["requires"]]
    found = [int(m.group(1)) for m in floors if m]
    assert found and found[0] >= 77, pyproject["build-system"]["requires"]


def test_the_oldest_triton_allowed_is_the_one_make_test_checks():
    """`make test-triton-min` runs the kernels with the lower bound of the triton range."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [d for d in deps if d.startswith("triton")]
    low = re.search(r">=\s*([\d.]+)", spec).group(1)
    pinned = re.search(r"^TRITON_MIN\s*:=\s*(\S+)", (REPO / "Makefile").read_text(), re.M).group(1)
    assert pinned.split(".")[:2] == low.split(".")[:2] and pinned.startswith(low), (spec, pinned)
    assert "$(MAKE) test-triton-min" in (REPO / "Makefile").read_text()
