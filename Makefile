# Thin wrapper over CMake: `make` builds build/cairn, `make test` runs every test plainly and
# under AddressSanitizer + UndefinedBehaviorSanitizer, `make run` serves the default model.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
MODEL ?= models/tiny

.PHONY: all build asan test test-plain test-asan run clean

all: build

build:
	@cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build build -j $(JOBS) -- --no-print-directory

asan:
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCAIRN_SANITIZE=ON >/dev/null
	@cmake --build build-asan -j $(JOBS) -- --no-print-directory

test-plain: build
	@mkdir -p build/tmp
	cd build && ctest --output-on-failure -j $(JOBS)

test-asan: asan
	@mkdir -p build-asan/tmp
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS)

test: test-plain test-asan

$(MODEL)/config.json: | build
	./build/cairn make-model --preset tiny --out $(MODEL)

run: build $(MODEL)/config.json
	./build/cairn serve --model $(MODEL)

clean:
	rm -rf build build-asan
