"""The GPU session scripts under scripts/ still import: they run only on a lent GPU, so nothing
else would notice when the package they call changes under them."""
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "scripts").glob("*.py"))


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_script_imports(path):
    spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)      # module level only: each script's work is behind __main__
    finally:
        del sys.modules[spec.name]
    assert callable(getattr(module, "main", None)) or callable(getattr(module, "strip", None))
