# sluice: set-up, build and test in one place. The README's two commands are
# `make run` and `make test`; both install what is missing first.
#
#   make run        build and run sluiced on conf/sluice.toml (local-only)
#   make test       build with warnings as errors and run every test
#   make test-asan  the same under AddressSanitizer + UndefinedBehaviorSanitizer
#                   (without the timing-bound fleet tests, label `fleet`)
#   make test-tsan  the same under ThreadSanitizer
#   make bench      build optimised and print the benchmark figures
#   make deps       install the Debian packages the build needs

PACKAGES := cmake make g++ pkg-config libuv1-dev libhiredis-dev libmsgpack-cxx-dev \
            libtomlplusplus-dev libspdlog-dev libfmt-dev googletest libgtest-dev \
            redis-server python3-msgpack
JOBS ?= $(shell nproc)
WERROR ?= ON
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# Where `make run` serves: the config's /run/sluice when it is writable,
# otherwise a per-user directory that needs no root.
RUN_DIR = $(shell if [ -w /run/sluice ] || mkdir -p /run/sluice 2>/dev/null; then echo /run/sluice; \
             elif [ -n "$$XDG_RUNTIME_DIR" ]; then echo $$XDG_RUNTIME_DIR/sluice; \
             else echo /tmp/sluice-$$(id -u); fi)

.PHONY: all deps build run test test-asan test-tsan bench clean

all: build

deps:
	@missing=$$(for p in $(PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null \
	    | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

# build-<flavour>/ is configured once and rebuilt incrementally.
define configure
	cmake -S . -B $(1) -DCMAKE_BUILD_TYPE=$(2) -DSLUICE_WERROR=$(WERROR) $(3) >/dev/null
	cmake --build $(1) -j $(JOBS)
endef

build: deps
	$(call configure,build,RelWithDebInfo,)

run: build
	@mkdir -p $(RUN_DIR)
	./build/daemon/sluiced --config conf/sluice.toml --socket $(RUN_DIR)/sluice.sock

test: build
	cd build && ctest --output-on-failure -j $(JOBS)

test-asan: deps
	$(call configure,build-asan,Debug,-DSLUICE_ASAN=ON -DSLUICE_BUILD_BENCH=OFF)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS) -LE fleet

test-tsan: deps
	$(call configure,build-tsan,RelWithDebInfo,-DSLUICE_TSAN=ON -DSLUICE_BUILD_BENCH=OFF)
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j $(JOBS) -LE fleet

bench: deps
	$(call configure,build-release,Release,-DSLUICE_BUILD_TESTS=OFF)
	./bench/run.sh build-release

clean:
	rm -rf build build-asan build-tsan build-release
