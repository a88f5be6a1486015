"""The project's history reads as a list of titles: every commit after the rule was set has a
subject of at most 72 characters (docs/ARCHITECTURE.md, "Commit subjects are titles")."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The last commit before the rule: its subject and older ones are as they were written.
RULE_SET_AFTER = "1a398ca"

#: A subject, as ``git log --format=%s`` prints it, may be this long at most.
MOST = 72


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout


def too_long(subjects: list[str]) -> list[str]:
    return [f"{len(s)} characters: {s}" for s in subjects if len(s) > MOST]


def test_the_check_finds_a_long_subject():
    assert too_long(["x" * 72, "y" * 73]) == ["73 characters: " + "y" * 73]


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="not a git checkout (an unpacked release): no history to check")
def test_commit_subjects_are_at_most_72_characters():
    known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{RULE_SET_AFTER}^{{commit}}"],
                           capture_output=True).returncode == 0
    # A shallow clone may lack the rule's commit; every commit it holds is then checked.
    span = [f"{RULE_SET_AFTER}..HEAD"] if known else ["HEAD"]
    subjects = git("log", "--format=%s", *span).splitlines()
    assert subjects or known, "git log printed no commit"
    assert too_long(subjects) == [], "shorten these subjects (git rebase -i), the detail goes in the body"
