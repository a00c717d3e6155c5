# sluice: set-up, build and test in one place. The README's two commands are
# `make run` and `make test`; both install what is missing first.
#
#   make run        build sluiced and sluicectl (nothing else) and run sluiced
#                   on conf/sluice.toml (local-only)
#   make test       build with warnings as errors and run every test
#   make test-asan  the same under AddressSanitizer + UndefinedBehaviorSanitizer
#                   (without the timing-bound fleet, Sentinel and Cluster
#                   failover tests, labels `fleet`, `sentinel` and `cluster`,
#                   nor the client libraries' tests, label `client`, nor the
#                   package test, label `package`)
#   make test-tsan  the same under ThreadSanitizer, built without Envoy's gRPC
#                   front (SLUICE_GRPC=OFF: Debian's gRPC is not built for it)
#                   and with only the unit tests that run threads (THREADS)
#   make test-valgrind  the integration tests against sluiced under valgrind
#                   memcheck (tests/memcheck.sh; on demand, not in CI): exit 0
#                   when no daemon run had a memory error or lost a block
#   make bench      build optimised and print the benchmark figures: the
#                   local path (bench/run.sh), the global path against a
#                   redis-server of its own (bench/global.sh), Envoy's rate
#                   limit service (bench/rls.sh: ShouldRateLimit/s with one
#                   and four descriptors, latency, Redis down), the client
#                   libraries of each language (bench/clients.sh), and the fleet
#                   (bench/fleet.py: N daemons on one Redis under load shapes
#                   and Redis faults), with PNG plots (bench/plots.py), into
#                   bench/results/; BENCH_MODE=quick is a smoke run of under
#                   a minute (its files end in -quick and are not kept)
#   make fuzz       build the libFuzzer targets (clang) and run each for
#                   FUZZ_SECONDS (default 60) on a copy of its corpus
#   make install    build optimised and install under PREFIX (default /usr,
#                   where the systemd units look; DESTDIR stages it elsewhere)
#   make package    build optimised and make the Debian package,
#                   build-release/sluice_<version>_<arch>.deb (CPack)
#   make deps       install the Debian packages the build needs

PACKAGES := cmake make g++ pkg-config libuv1-dev libhiredis-dev libmsgpack-cxx-dev libsystemd-dev \
            libmicrohttpd-dev libyaml-cpp-dev \
            libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc python3-grpcio \
            libnghttp2-dev \
            python3-protobuf \
            libtomlplusplus-dev libhowardhinnant-date-dev tzdata libspdlog-dev libfmt-dev \
            googletest libgtest-dev \
            redis-server python3-msgpack systemd prometheus curl nginx-light python3-redis
# node and npm for the Node example's test, looked for as commands rather than
# packages: NodeSource's nodejs bundles npm and conflicts with Debian's npm.
NODE_PACKAGES := nodejs npm
# dpkg-shlibdeps (dpkg-dev) and file work out the package's Depends; lintian
# checks the package (the `package` test, part of `make test`).
PACKAGE_PACKAGES := dpkg-dev file lintian
# matplotlib draws the benchmark's plots.
BENCH_PACKAGES := python3-matplotlib wrk
# The client libraries' tests (client/<language>/): toolchains and libraries.
CLIENT_PACKAGES :=
CLIENT_PACKAGES += python3-msgpack python3-uvicorn python3-pip python3-setuptools
CLIENT_PACKAGES += golang-go golang-github-vmihailenco-msgpack.v5-dev
CLIENT_PACKAGES += default-jdk-headless libmsgpack-java libjakarta-servlet-api-java junit5 libtomcat10-java
FUZZ_PACKAGES := clang libclang-rt-14-dev
VALGRIND_PACKAGES := valgrind
FUZZ_TARGETS := rpc config lease_reply resp http envoy_yaml envoy_request
FUZZ_SECONDS ?= 60
JOBS ?= $(shell nproc)
WERROR ?= ON
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# Where `make run` serves: the config's /run/sluice when it is writable,
# otherwise a per-user directory that needs no root.
RUN_DIR = $(shell if [ -w /run/sluice ] || mkdir -p /run/sluice 2>/dev/null; then echo /run/sluice; \
             elif [ -n "$$XDG_RUNTIME_DIR" ]; then echo $$XDG_RUNTIME_DIR/sluice; \
             else echo /tmp/sluice-$$(id -u); fi)

.PHONY: all deps build run test test-asan test-tsan test-valgrind bench install package fuzz clean

all: build

# $(call install,packages): installs those of the Debian packages that are missing.
define install
	@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null \
	    | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi
endef

deps:
	$(call install,$(PACKAGES) $(PACKAGE_PACKAGES) $(CLIENT_PACKAGES))
	$(if $(shell command -v npm),,$(call install,$(NODE_PACKAGES)))

# build-<flavour>/ is configured once and rebuilt incrementally.
# $(4), when given, names the targets to build (--target ...); all by default.
define configure
	cmake -S . -B $(1) -DCMAKE_BUILD_TYPE=$(2) -DSLUICE_WERROR=$(WERROR) $(3) >/dev/null
	cmake --build $(1) -j $(JOBS)$(if $(4), --target $(4))
endef

build: deps
	$(call configure,build,RelWithDebInfo,)

# `make run` builds only what running needs, the daemon and the tool to ask it,
# not the test tree: the daemon is up in about half the time of a full build.
RUN_TARGETS := sluiced sluicectl

run: deps
	$(call configure,build,RelWithDebInfo,,$(RUN_TARGETS))
	@mkdir -p $(RUN_DIR)
	./build/daemon/sluiced --config conf/sluice.toml --socket $(RUN_DIR)/sluice.sock

test: build
	cd build && ctest --output-on-failure -j $(JOBS)

test-asan: deps
	$(call configure,build-asan,Debug,-DSLUICE_ASAN=ON -DSLUICE_BUILD_BENCH=OFF)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS) -LE 'fleet|sentinel|cluster|client|package'

test-tsan: deps
	$(call configure,build-tsan,RelWithDebInfo,-DSLUICE_TSAN=ON -DSLUICE_BUILD_BENCH=OFF -DSLUICE_GRPC=OFF)
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j $(JOBS) -LE 'fleet|sentinel|cluster|client|package|grpc'

test-valgrind: build
	$(call install,$(VALGRIND_PACKAGES))
	tests/memcheck.sh build

bench: deps
	$(call install,$(BENCH_PACKAGES))
	$(call configure,build-release,Release,-DSLUICE_BUILD_TESTS=OFF)
	./bench/run.sh build-release
	./bench/global.sh build-release
	./bench/fronts.sh build-release
	./bench/rls.sh build-release
	$(call install,$(CLIENT_PACKAGES))
	./bench/clients.sh build-release
	/usr/bin/python3 bench/fleet.py build-release
	/usr/bin/python3 bench/plots.py

# install and package share build-release with bench, configured for the
# prefix /usr: the units name /usr/sbin/sluiced and /etc/sluice/sluice.toml,
# and Debian's multiarch libdir follows from it. `make install PREFIX=/opt/x`
# or `DESTDIR=/tmp/root make install` install elsewhere (docs/operations.md,
# "Install and package"); root (sudo) is asked for only without DESTDIR.
PREFIX ?= /usr
RELEASE_ARGS := -DSLUICE_BUILD_TESTS=OFF -DCMAKE_INSTALL_PREFIX=/usr

install: deps
	$(call configure,build-release,Release,$(RELEASE_ARGS))
	$(if $(DESTDIR),,$(SUDO)) env DESTDIR="$(DESTDIR)" cmake --install build-release --prefix "$(PREFIX)"

package: deps
	$(call install,$(PACKAGE_PACKAGES))
	$(call configure,build-release,Release,$(RELEASE_ARGS))
	cd build-release && cpack -G DEB

# Each fuzzer runs on build-fuzz/corpus/<target>, a copy of fuzz/corpus/<target>
# that keeps what earlier runs found, so new inputs stay out of the tree; a
# crash is saved in build-fuzz/artifacts/<target>/ and stops the run. Debug
# keeps assertions on (the fuzz build adds -O1).
fuzz: deps
	$(call install,$(FUZZ_PACKAGES))
	CC=clang CXX=clang++ $(call configure,build-fuzz,Debug,-DSLUICE_FUZZ=ON -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_BENCH=OFF)
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p build-fuzz/corpus/$$t build-fuzz/artifacts/$$t && \
	  cp -r fuzz/corpus/$$t/. build-fuzz/corpus/$$t/ && \
	  echo "fuzz_$$t: $(FUZZ_SECONDS) s on build-fuzz/corpus/$$t" && \
	  if ! build-fuzz/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=10 \
	        -artifact_prefix=build-fuzz/artifacts/$$t/ build-fuzz/corpus/$$t \
	        >build-fuzz/fuzz_$$t.log 2>&1; then \
	    tail -n 40 build-fuzz/fuzz_$$t.log; \
	    echo "fuzz_$$t failed; the input is in build-fuzz/artifacts/$$t/, the log in build-fuzz/fuzz_$$t.log"; \
	    exit 1; \
	  fi; \
	  grep -E '^Done [0-9]+ runs' build-fuzz/fuzz_$$t.log | sed "s/^/fuzz_$$t: /"; \
	done

clean:
	rm -rf build build-asan build-tsan build-release build-fuzz
