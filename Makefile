# Set-up and entry points. Every target creates .venv if missing and installs what it needs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
FMNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz

.PHONY: demo test test-slow test-long bench docs docs-serve fmnist-data clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.installed-base: pyproject.toml | $(PY)
	$(PY) -m pip install -qq -e .
	@touch $@

$(VENV)/.installed-dev: pyproject.toml | $(PY)
	$(PY) -m pip install -qq -e ".[dev]"
	@touch $@ $(VENV)/.installed-base

$(VENV)/.installed-docs: pyproject.toml | $(PY)
	$(PY) -m pip install -qq -e ".[docs]"
	@touch $@ $(VENV)/.installed-base

$(VENV)/.installed-bench: pyproject.toml | $(PY)
	$(PY) -m pip install -qq -e ".[dev,bench]"
	@touch $@ $(VENV)/.installed-dev $(VENV)/.installed-base

# The full Fashion-MNIST (60k/10k) from Debian, for the integration tests and the benchmark.
fmnist-data:
	@if [ ! -e $(FMNIST) ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || \
	    (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1) || \
	    echo "note: could not install dataset-fashion-mnist; Fashion-MNIST tests will be skipped"; \
	  else \
	    echo "note: Fashion-MNIST tests will be skipped; enable them with: sudo apt-get install dataset-fashion-mnist"; \
	  fi; \
	fi

# The main job on the embedded default dataset (scikit-learn digits); never overwrites an earlier demo.
demo: $(VENV)/.installed-base
	$(VENV)/bin/fedjax-dp run --config experiments/demo.yaml --out runs/demo-$$(date +%Y%m%d-%H%M%S)
	@echo "fedjax-dp is installed in $(VENV): run 'source $(VENV)/bin/activate' to put it on PATH (README, Quick start)"

test: $(VENV)/.installed-dev fmnist-data
	$(PY) -m pytest -q -n 2

test-slow: $(VENV)/.installed-dev fmnist-data
	$(PY) -m pytest -q -n 2 -m "slow and not long"

# What CI leaves out (marker long): the README's paper-script commands and the full
# product of the privacy grids (CI runs their covering arrays), over an hour of CPU:
# run after changing experiments/, the README's reproduction sections or privacy code
test-long: $(VENV)/.installed-dev fmnist-data
	$(PY) -m pytest -q -n 2 -m long

# Our Flower-style partitions (data/flwr_partitions.py) against flwr-datasets itself, in a
# venv of its own (.venv-flwr: flwr-datasets brings Hugging Face datasets and pyarrow)
.PHONY: test-flwr
test-flwr:
	@test -x .venv-flwr/bin/python || $(PYTHON) -m venv .venv-flwr
	@test -e .venv-flwr/.installed || (.venv-flwr/bin/pip install -q -e . flwr-datasets==0.6.1 \
	  pytest && touch .venv-flwr/.installed)
	.venv-flwr/bin/python -m pytest -q -p no:cacheprovider tests/test_flwr_datasets_match.py

# The documentation site into site/, every warning an error (a broken link, a page
# outside the nav, a docstring mkdocstrings cannot read). NO_MKDOCS_2_WARNING: Material's
# banner about MkDocs 2.0, which is not a warning about these pages
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

docs-serve: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

bench: $(VENV)/.installed-bench fmnist-data
	$(PY) benchmarks/fedavg_round.py

clean:
	rm -rf $(VENV) build site *.egg-info .pytest_cache
