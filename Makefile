# Two entry points for people: `make demo` and `make test`. Both install what
# they need first (Debian packages, a virtualenv from Debian's python3), so
# they work on a fresh machine.

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CMAKE := $(VENV)/bin/cmake
APT_PACKAGES := build-essential libboost-dev libtbb-dev libgtest-dev libgmock-dev libbenchmark-dev \
	python3-dev python3-venv python3-numpy util-linux procps
PY_PACKAGES := scikit-build-core pybind11 pybind11-stubgen pytest pytest-timeout ninja cmake torch==2.13.0 jax grain threadpoolctl
JOBS ?= 2

.PHONY: demo test deps build-cpp build-sanitizers install-py stubs test-cpp test-sanitizers test-py bench clean

demo: install-py
	$(PY) python/examples/demo.py

test: test-cpp test-sanitizers test-py

# --- set-up -----------------------------------------------------------------
deps: $(VENV)/.deps-ok

$(VENV)/.deps-ok: Makefile
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	# Debian's python3 (not a per-user one): the thread-limit tests run it as an
	# unprivileged uid, which must be able to read the interpreter and numpy.
	[ -x $(PY) ] || /usr/bin/python3 -m venv --system-site-packages $(VENV)
	$(PIP) install -q $(PY_PACKAGES)
	touch $@

install-py: deps
	$(PIP) install -q --no-build-isolation .

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

test-py: install-py
	$(PY) -m pytest -v

# --- benchmarks (numbers go to bench/results/, summarized in docs/) ---------
bench: build-cpp install-py
	./build/cpp/bench/cpp/ring_bench --benchmark_min_time=0.2
	$(PY) bench/python/transport_bench.py
	$(PY) bench/python/thread_bench.py
	$(PY) bench/python/grain_bench.py

clean:
	rm -rf build $(VENV)
