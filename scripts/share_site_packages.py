"""Let this Python's virtual environment read every package of another one, after its own.

    .venv-triton-min/bin/python scripts/share_site_packages.py .venv/bin/python

``make test-triton-min`` installs one package (an older triton) into a small venv and takes the
rest (torch, numpy, pytest, the editable moe_tutorial) from ``.venv``, instead of installing
them twice. It writes a ``.pth`` file into this environment's site-packages that adds the
other's site-packages with :func:`site.addsitedir` (which also runs the ``.pth`` files there, as
the editable install needs); this environment's own packages come first on ``sys.path``.
"""
from __future__ import annotations

import site
import subprocess
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: share_site_packages.py OTHER_PYTHON", file=sys.stderr)
        return 2
    other = subprocess.run([argv[0], "-c", "import site; print(site.getsitepackages()[0])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    mine = Path(site.getsitepackages()[0])
    (mine / "zz-shared-site-packages.pth").write_text(f"import site; site.addsitedir({other!r})\n")
    print(f"{mine} reads {other} after its own packages")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
