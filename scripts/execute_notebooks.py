"""Run notebooks top to bottom in place, then drop per-run noise, so stored outputs match a fresh run.

Usage: .venv/bin/python scripts/execute_notebooks.py notebooks/03_triton_fused_kernel.ipynb ...
Each notebook runs in its own folder (as JupyterLab and nbval run it) with the project's kernel.
"""
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

sys.path.insert(0, str(Path(__file__).parent))
from strip_notebook_metadata import strip  # noqa: E402


def main(paths: list[str]) -> None:
    for arg in paths:
        path = Path(arg)
        nb = nbformat.read(path, as_version=4)
        t0 = time.perf_counter()
        resources = {"metadata": {"path": str(path.parent)}}
        NotebookClient(nb, timeout=600, kernel_name="python3", resources=resources).execute()
        nbformat.write(nb, path)
        strip(path)
        print(f"{path}: {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
