# Thin wrapper over CMake: `make` builds build/cairn, `make test` runs every test plainly and
# under AddressSanitizer + UndefinedBehaviorSanitizer (never the GPU tests), `make test-cuda` builds
# build-cuda with the CUDA backend and runs the GPU tests on a machine that has one (`make
# memcheck-cuda`: under compute-sanitizer). `make run` chats with the default model in the
# terminal, `make serve` serves it (models/cobble, committed; MODEL=DIR for another), `make
# install` puts the binary in PREFIX/bin and the default model in PREFIX/share/cairn (PREFIX
# defaults to /usr/local). On a fresh Debian or Ubuntu machine the first build installs the
# packages it needs (tools/deps.sh; it names them when it cannot).
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
MODEL ?= models/cobble
PREFIX ?= /usr/local

.PHONY: all deps build asan cuda test test-plain test-asan test-cuda memcheck-cuda run serve install clean

all: build

# Checked until a build folder exists: then CMake has found everything once.
deps:
	@[ -f build/CMakeCache.txt ] || tools/deps.sh

build: deps
	@cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build build -j $(JOBS) -- --no-print-directory

asan: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCAIRN_SANITIZE=ON -DCAIRN_CUDA=OFF >/dev/null
	@cmake --build build-asan -j $(JOBS) -- --no-print-directory

test-plain: build
	@mkdir -p build/tmp
	cd build && ctest --output-on-failure -j $(JOBS) -LE gpu

test-asan: asan
	@mkdir -p build-asan/tmp
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS) -LE 'gpu|agents'

test: test-plain test-asan

cuda:
	@cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAIRN_CUDA=ON >/dev/null
	@cmake --build build-cuda -j $(JOBS) -- --no-print-directory

# On the GPU: the per-op CUDA-vs-CPU test, then the parity goldens, the cache scenarios, the
# speculation exactness tests and the CLI with every model on the CUDA backend (CAIRN_BACKEND=cuda;
# tests that build their own CPU reference keep it); then the op test and the forward again with
# decode steps launched eagerly instead of as CUDA graphs (CAIRN_CUDA_GRAPHS=0).
test-cuda: cuda
	@mkdir -p build-cuda/tmp
	cd build-cuda && CAIRN_BACKEND=cuda ctest --output-on-failure -j 1 \
	  -R '^(tensor/test_cuda_ops|model/test_forward|cache/|engine/test_speculate|cli/test_cli)'
	cd build-cuda && CAIRN_BACKEND=cuda CAIRN_CUDA_GRAPHS=0 ctest --output-on-failure -j 1 \
	  -R '^(tensor/test_cuda_ops|model/test_forward)$$'

# On the GPU: compute-sanitizer's memcheck over the CUDA op test, the forward and speculation on
# the CUDA backend, stopping at the first test with an error (the op test takes about a minute;
# speculation's sampling test draws 150 seeds a case instead of 1500: the same paths, the
# statistics looser).
memcheck-cuda: cuda
	@mkdir -p build-cuda/tmp
	for t in tensor_test_cuda_ops model_test_forward engine_test_speculate; do \
	  CAIRN_BACKEND=cuda CAIRN_BIN=build-cuda/cairn CAIRN_TMP=build-cuda/tmp CAIRN_DATA=tests/data \
	  CAIRN_TEST_SEEDS=150 \
	  compute-sanitizer --tool memcheck --error-exitcode 9 build-cuda/$$t || exit 1; done

# models/tiny is not committed: a synthetic one is made when asked for (make run MODEL=models/tiny, make serve MODEL=...).
models/tiny/config.json: | build
	./build/cairn make-model --preset tiny --out models/tiny

run: build $(if $(filter models/tiny,$(MODEL)),models/tiny/config.json)
	./build/cairn run --model $(MODEL)

serve: build $(if $(filter models/tiny,$(MODEL)),models/tiny/config.json)
	./build/cairn serve --model $(MODEL)

install: build
	cmake --install build --prefix $(PREFIX)

clean:
	rm -rf build build-asan build-cuda
