"""After new data: rewrite the sentences the prose tests say are stale, then show what changed.

Usage: .venv/bin/python scripts/update_prose.py [tests/test_prose_*.py ...]

Runs the prose tests (tests/prose.py's ``assert_says``). For every failure "NB should say 'X'",
it finds the one sentence in NB's markdown that reads like X with other numbers (numbers are
wildcards, line breaks count as spaces) and replaces it with X. A sentence found zero or several
times is left alone and listed. Read the diff before committing: the numbers changed, and the
words around them may need to change too.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAILURE = re.compile(r"AssertionError: (\S+) should say (['\"])(.*?)\2; it says ", re.S)


def sentence_pattern(sentence: str) -> re.Pattern:
    parts = re.split(r"(\d+(?:\.\d+)?(?:e-?\d+)?)", sentence)
    number = r"\d+(?:\.\d+)?(?:e-?\d+)?"
    regex = "".join(number if i % 2 else re.sub(r"(?:\\ |\s)+", r"\\s+", re.escape(p)) for i, p in enumerate(parts))
    return re.compile(regex)


def rewrite(notebook: str, sentence: str) -> str:
    path = ROOT / "notebooks" / (notebook if notebook.endswith(".ipynb") else f"{notebook}.ipynb")
    nb = json.loads(path.read_text())
    pattern = sentence_pattern(sentence)
    hits = [(c, m) for c in nb["cells"] if c["cell_type"] == "markdown"
            for m in pattern.finditer("".join(c["source"]))]
    if len(hits) != 1:
        return f"{notebook}: {len(hits)} matches for {sentence[:60]!r}; left alone"
    cell, match = hits[0]
    text = "".join(cell["source"])
    cell["source"] = (text[:match.start()] + sentence + text[match.end():]).splitlines(keepends=True)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return f"{notebook}: rewrote {sentence[:70]!r}"


def main(args: list[str]) -> int:
    tests = args or [str(p) for p in sorted((ROOT / "tests").glob("test_prose_*.py"))]
    seen: set = set()
    while True:   # a test stops at its first stale sentence: run again until nothing new is stale
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                             capture_output=True, text=True, cwd=ROOT)
        failures = [f for f in dict.fromkeys(FAILURE.findall(run.stdout)) if f not in seen]
        if not failures:
            break
        for failure in failures:
            seen.add(failure)
            notebook, _, sentence = failure
            print(rewrite(notebook, sentence.replace("\\'", "'")))
    print("every prose test passes" if run.returncode == 0 else "some prose tests still fail: read their output")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
