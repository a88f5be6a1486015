"""Drop per-run noise (execution timestamps) from notebooks so diffs show only real changes.

Usage: python scripts/strip_notebook_metadata.py notebooks/*.ipynb notebooks/exercises/*.ipynb
"""
import json
import sys


def strip(path) -> None:
    """Rewrite the notebook at ``path`` without its cells' execution timestamps."""
    with open(path) as f:
        nb = json.load(f)
    for cell in nb["cells"]:
        cell.get("metadata", {}).pop("execution", None)
    with open(path, "w") as f:
        json.dump(nb, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        strip(arg)
