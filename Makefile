# Two commands do everything on a fresh machine with Python 3 and pip:
#   make lab    set up, then open JupyterLab on notebooks/
#   make test   set up, then run every test (package, exercises, notebooks, browser)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup lab test test-fast test-triton-min test-browser lint bench clean

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
	$(MAKE) test-triton-min
	$(MAKE) test-browser

# Lint alone: pyflakes, line length 120, import order (moe_tutorial before triton).
lint: $(STAMP)
	$(BIN)/ruff check .

# The package and checker tests only, no notebooks (a quick loop while editing).
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests -m "not browser"

# pyproject.toml allows a range of Triton releases; .venv has the newest. This pass runs the
# kernels, the interpreter hooks and notebook 06's gloo demos again in Triton's interpreter with
# the oldest release the range allows (its lower bound: tests/test_environment.py checks they agree).
# .venv-triton-min holds that triton alone and reads every other package from .venv.
TRITON_MIN := 3.4.0
VENV_MIN   := .venv-triton-min
MIN_STAMP  := $(VENV_MIN)/.installed-$(TRITON_MIN)
MIN_TESTS  := tests/test_triton_min.py tests/test_sorted_kernel.py tests/test_fused_kernel.py \
              tests/test_minimal_sorted_kernel.py tests/test_topk_sum.py tests/test_published_kernel.py \
              tests/test_interpreter.py tests/test_align.py tests/test_parallel.py tests/test_backward_kernel.py \
              tests/test_toy_kernel.py tests/test_fp8_cast.py

$(MIN_STAMP): $(STAMP)
	rm -rf $(VENV_MIN)
	$(PYTHON) -m venv $(VENV_MIN)
	$(VENV_MIN)/bin/python -m pip install --quiet --no-deps triton==$(TRITON_MIN)
	$(VENV_MIN)/bin/python scripts/share_site_packages.py $(BIN)/python
	touch $(MIN_STAMP)

test-triton-min: $(MIN_STAMP)
	MOE_EXPECT_TRITON=$(TRITON_MIN) $(VENV_MIN)/bin/python -m pytest $(MIN_TESTS) -m "not gpu and not gpu2" \
	    -p no:cacheprovider -p no:nbval -q

test-browser: $(STAMP)
	bash scripts/ensure_chromium.sh
	$(BIN)/python -m pytest tests/browser -m browser -p no:cacheprovider

bench: $(STAMP)
	$(BIN)/python -m moe_tutorial bench

clean:
	rm -rf $(VENV) $(VENV_MIN) artifacts .pytest_cache
