# Two commands do everything on a fresh machine with Python 3 and pip:
#   make lab    set up, then open JupyterLab on notebooks/
#   make test   set up, then run every test (package, exercises, notebooks, browser)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup lab test test-fast test-browser lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev,browser]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (moe_tutorial)" >/dev/null
	touch $(STAMP)

# Jupyter refuses to run as root unless told; containers and cloud boxes often are root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/ $(ROOT_FLAG)

# Everything: lint, package tests, exercise checkers, notebooks through nbval, then the browser test.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -m "not browser" --nbval --nbval-current-env -p no:cacheprovider
	$(MAKE) test-browser

# Lint alone: pyflakes, line length 120, import order (moe_tutorial before triton).
lint: $(STAMP)
	$(BIN)/ruff check .

# The package and checker tests only, no notebooks (a quick loop while editing).
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests -m "not browser"

test-browser: $(STAMP)
	bash scripts/ensure_chromium.sh
	$(BIN)/python -m pytest tests/browser -m browser -p no:cacheprovider

bench: $(STAMP)
	$(BIN)/python -m moe_tutorial bench

clean:
	rm -rf $(VENV) artifacts .pytest_cache
