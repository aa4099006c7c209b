# kiln: `make demo` and `make test` are the two entry points (see README.md).
# Each installs what is missing (idempotent), builds, then does its job.

BUILD      ?= build
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo
ONNX123    := $(BUILD)/onnx-1.23-node
DEPS_STAMP := $(BUILD)/.deps-stamp

.PHONY: all deps build demo test unit conformance errors fuzz clean

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
conformance: build $(ONNX123)/.stamp
	$(BUILD)/tests/kiln_conformance --onnx-1.23-node $(ONNX123) --json $(BUILD)/conformance.json --jobs $(JOBS) \
	  --check-targets tests/conformance/targets.txt --pipeline

errors: build
	bash tests/error/run.sh $(BUILD)/kiln

fuzz: $(DEPS_STAMP)
	bash tests/fuzz/run.sh $(BUILD)-fuzz 60

test: unit conformance errors fuzz
	@echo "make test: all checks passed"

clean:
	rm -rf $(BUILD) $(BUILD)-fuzz
