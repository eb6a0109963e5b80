# mm3 — the two commands a newcomer needs:
#   make demo   install dependencies, build, run the main job
#   make test   install dependencies, build, run every test (ctest)
BUILD ?= build
JOBS ?= $(shell nproc)
GOLDEN ?= ../shared/golden/v1
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release -DMM3_WERROR=ON

.PHONY: all deps build test demo clean

all: build

deps:
	@./scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo: build
	@./scripts/demo.sh $(BUILD)/mm3 $(GOLDEN)

clean:
	rm -rf $(BUILD)
