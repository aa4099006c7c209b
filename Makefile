# kiln: `make demo` and `make test` are the two entry points (see README.md).
# Each installs what is missing (idempotent), builds, then does its job.

BUILD      ?= build
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo
ONNX123    := $(BUILD)/onnx-1.23-node
DEPS_STAMP := $(BUILD)/.deps-stamp
ONNX112    ?= /usr/share/libonnx-testdata/data

.PHONY: all deps build demo test unit conformance conformance-gpu errors quant tp python serve engines examples fuzz fuzz-long test-sanitize sanitize-sample clean

all: build

# Re-run the installer when it changes; it is a no-op when everything is present.
$(DEPS_STAMP): scripts/install-deps.sh
	@bash scripts/install-deps.sh
	@mkdir -p $(BUILD) && touch $@

deps: $(DEPS_STAMP)

$(BUILD)/CMakeCache.txt: $(DEPS_STAMP) CMakeLists.txt
	cmake -S . -B $(BUILD) $(CMAKE_ARGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	@bash tools/demo/demo.sh $(BUILD)/kiln

unit: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

$(ONNX123)/.stamp: $(DEPS_STAMP) tools/gen_onnx_tests.py
	python3 tools/gen_onnx_tests.py $(ONNX123) 2>$(BUILD)/gen_onnx_tests.log
	@touch $@

# With the default pass pipeline on every model first, as `kiln run` does (issue 4: the suites must
# still pass with the full pipeline enabled).
# Then the same suites on the fast CPU backend (oneDNN steps with the reference kernels between them,
# as `kiln run --device cpu` runs), held to the same minimums.
conformance: build $(ONNX123)/.stamp
	$(BUILD)/tests/kiln_conformance --onnx-1.23-node $(ONNX123) --json $(BUILD)/conformance.json --jobs $(JOBS) \
	  --check-targets tests/conformance/targets.txt --pipeline
	$(BUILD)/tests/kiln_conformance --onnx-1.23-node $(ONNX123) --json $(BUILD)/conformance-cpu-fast.json \
	  --jobs $(JOBS) --check-targets tests/conformance/targets.txt --pipeline --device cpu-fast

# The node suites on the CUDA backend at fp32 with CPU fallback forbidden (issue 27). Run on the GPU
# machine from binaries built here (carry $(BUILD)/tests and the 1.12 test data): it builds nothing.
conformance-gpu:
	bash bench/conformance-gpu.sh $(BUILD)/tests $(ONNX112)

errors: build
	bash tests/error/run.sh $(BUILD)/kiln

# Engine files through the CLI: build, save, load, run bit-identically, and every kind of damage
# named (tests/engine/run.sh).
engines: build
	bash tests/engine/run.sh $(BUILD)/kiln

# Post-training quantization end to end: QDQ models written, checked, and run by onnxruntime and
# kiln (tests/quant/run.sh).
quant: build
	bash tests/quant/run.sh $(BUILD)/kiln

# Tensor parallelism end to end: GPT-2- and Llama-style models split over 1, 2 and 4 CPU ranks
# against onnxruntime, engine files, the estimator, errors (tests/tp/run.sh).
tp: build
	bash tests/tp/run.sh $(BUILD)/kiln

# The Python package as `pip install .` builds it (pyproject.toml), here in the existing build folder
# (only the module is new work) and installed under it, then its pytest suite (python/tests).
python: build
	CMAKE_GENERATOR="Unix Makefiles" python3 -m pip install -q --no-build-isolation --no-deps --upgrade \
	  --target $(abspath $(BUILD))/python-site --config-settings=build-dir=$(abspath $(BUILD)) .
	PYTHONPATH=$(abspath $(BUILD))/python-site python3 -m pytest -q -p no:cacheprovider python/tests

# kiln serve (KServe v2 over HTTP and gRPC, config.pbtxt, the batcher) driven by tritonclient (tests/serve).
serve: build
	KILN=$(abspath $(BUILD))/kiln python3 -m pytest -q -p no:cacheprovider tests/serve

# The public API as a user meets it: install kiln, build examples/ against the installed package
# with find_package(kiln), and run it on the CPU.
examples: build
	cmake --install $(BUILD) --prefix $(abspath $(BUILD))/install >/dev/null
	cmake -S examples -B $(BUILD)/examples -DCMAKE_PREFIX_PATH=$(abspath $(BUILD))/install >/dev/null
	cmake --build $(BUILD)/examples -j $(JOBS)
	$(BUILD)/examples/classify models/efficientnet-lite0/model.onnx models/efficientnet-lite0/chelsea.npy \
	  $(BUILD)/examples/efficientnet-lite0.kiln cpu
	$(BUILD)/examples/load_engine $(BUILD)/examples/efficientnet-lite0.kiln 2
	$(BUILD)/examples/load_engine_shared $(BUILD)/examples/efficientnet-lite0.kiln 1

# ASan + UBSan over the unit tests, pass goldens, bad-input and engine-file suites and the
# conformance suites (CPU code; tests/sanitize/run.sh). Its own build takes ~30 min on 2 cores, so
# `make test` runs the sample below instead.
test-sanitize: $(DEPS_STAMP) $(ONNX123)/.stamp
	bash tests/sanitize/run.sh $(BUILD)-asan

# The part of it `make test` runs: the fuzz build is already ASan + UBSan, so the CLI and the unit
# tests are added to it and the unit, bad-input and engine-file suites run under the sanitizers.
sanitize-sample: fuzz
	bash tests/sanitize/run.sh $(BUILD)-fuzz sample

# The importer for 45 s, the seven other targets for 11 s each (make test's time: CI runs it on 2 cores).
fuzz: $(DEPS_STAMP)
	bash tests/fuzz/run.sh $(BUILD)-fuzz 45

# Every fuzz target for SECONDS each (default 600), with the grown corpora kept in build-fuzz.
SECONDS ?= 600
fuzz-long: $(DEPS_STAMP)
	bash tests/fuzz/run.sh $(BUILD)-fuzz $(SECONDS) each

test: unit conformance errors engines quant tp python serve examples fuzz sanitize-sample
	@echo "make test: all checks passed"

clean:
	rm -rf $(BUILD) $(BUILD)-fuzz
