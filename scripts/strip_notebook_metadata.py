"""Drop per-run noise (execution timestamps, where a stream was cut) from notebooks so diffs show only real changes,
and give a cell added by hand the id nbformat 4.5 requires.

Usage: python scripts/strip_notebook_metadata.py notebooks/*.ipynb notebooks/exercises/*.ipynb
"""
import json
import sys
import uuid


def coalesce_streams(outputs: list) -> list:
    """Consecutive outputs of one stream as one: where the kernel cut a stream depends on timing."""
    merged: list = []
    for out in outputs:
        prev = merged[-1] if merged else None
        if prev and out.get("output_type") == "stream" == prev.get("output_type") and out["name"] == prev["name"]:
            text = "".join(prev["text"]) + "".join(out["text"])
            prev["text"] = text.splitlines(keepends=True)
        else:
            merged.append(out)
    return merged


def strip(path) -> None:
    """Rewrite the notebook at ``path`` without its cells' execution timestamps, streams coalesced,
    every cell with an id."""
    with open(path) as f:
        nb = json.load(f)
    for cell in nb["cells"]:
        cell.setdefault("id", uuid.uuid4().hex[:8])   # tests/test_stored_outputs.py checks they differ
        cell.get("metadata", {}).pop("execution", None)
        if "outputs" in cell:
            cell["outputs"] = coalesce_streams(cell["outputs"])
    with open(path, "w") as f:
        json.dump(nb, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        strip(arg)
