# Run `make` (or `make test`) to vet and test everything. The end-to-end tests
# start real redis-server processes (see e2e/redistest) and a headless
# Chromium (the status page test), and the quickstart check runs the
# README's commands with jq; `make test` installs redis-server, chromium and
# jq with apt-get when they are missing and make runs as root.

GO       ?= go
FUZZTIME ?= 30s

.DEFAULT_GOAL := all

.PHONY: all test redis browser jq quickstart vet bench e2e-long fuzz build clean

all: test

# grpclimit/ is a module of its own (so that gRPC stays out of the SDK's
# go.mod), outside ./...: it is vetted and tested from its directory.
# The multi-process scenarios of e2e/ run last and alone: they measure
# utilization and fairness, which other test binaries competing for the two
# cores would skew.
test: redis browser jq
	$(GO) vet ./...
	./scripts/quickstart-check.sh
	$(GO) test -race -count=1 -timeout 20m $$($(GO) list ./... | grep -v '/e2e$$')
	cd grpclimit && $(GO) vet ./... && $(GO) test -race -count=1 ./...
	$(GO) test -race -count=1 -timeout 20m ./e2e/

# Ensure redis-server is installed (RATELEASE_REDIS_SERVER, when set to an
# executable, is used by the tests instead of the one on PATH).
redis:
	@if [ -n "$${RATELEASE_REDIS_SERVER:-}" ] && [ -x "$${RATELEASE_REDIS_SERVER}" ]; then \
		echo "redis-server: $${RATELEASE_REDIS_SERVER} (RATELEASE_REDIS_SERVER)"; \
	elif command -v redis-server >/dev/null 2>&1; then \
		echo "redis-server: $$(command -v redis-server)"; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "redis-server is missing: installing it with apt-get"; \
		apt-get update || exit 1; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server || exit 1; \
		command -v redis-server >/dev/null 2>&1 || { echo "redis-server is still not on PATH after apt-get install" >&2; exit 1; }; \
	else \
		echo 'redis-server is missing: install it with `sudo apt-get install redis-server` (Debian/Ubuntu)' >&2; \
		exit 1; \
	fi

# Ensure a headless browser for the status page test of e2e/
# (RATELEASE_CHROMIUM, when set to an executable, is used instead of the
# chromium on PATH). Without root, the test skips and says why.
browser:
	@if [ -n "$${RATELEASE_CHROMIUM:-}" ] && [ -x "$${RATELEASE_CHROMIUM}" ]; then \
		echo "chromium: $${RATELEASE_CHROMIUM} (RATELEASE_CHROMIUM)"; \
	elif command -v chromium >/dev/null 2>&1; then \
		echo "chromium: $$(command -v chromium)"; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "chromium is missing: installing it with apt-get"; \
		apt-get update || exit 1; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y chromium || exit 1; \
		command -v chromium >/dev/null 2>&1 || { echo "chromium is still not on PATH after apt-get install" >&2; exit 1; }; \
	else \
		echo 'chromium is missing: install it with `sudo apt-get install chromium` (Debian); the status page test will skip' >&2; \
	fi

# Ensure jq, which the README's quickstart uses.
jq:
	@if command -v jq >/dev/null 2>&1; then \
		echo "jq: $$(command -v jq)"; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "jq is missing: installing it with apt-get"; \
		apt-get update || exit 1; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y jq || exit 1; \
	else \
		echo 'jq is missing: install it with `sudo apt-get install jq`' >&2; \
		exit 1; \
	fi

# The README's quickstart, run as written from a fresh clone of HEAD
# against a started rateleased (a few seconds).
quickstart: jq
	./scripts/quickstart-check.sh

vet:
	$(GO) vet ./...
	cd grpclimit && $(GO) vet ./...

# The end-to-end scenarios of e2e/ three times longer than in `make test`
# (about seven minutes on two cores).
e2e-long: redis
	RATELEASE_E2E_SCALE=3 $(GO) test -count=1 -v -timeout 60m ./e2e/

# Micro-benchmarks of the engine and the SDK, then the workload matrix of
# issue 8 (e2e/compare: the SDK, per-request Redis GCRA with redis_rate,
# per-request POST /v1/check and, where no limit binds, x/time/rate per
# process replay the same arrival schedules of five workloads, open loop,
# against one real redis-server and two rateleased on loopback, scored
# against an exact token bucket per key; plus a closed-loop hot-key run),
# which rewrites BENCHMARKS.md and docs/benchmarks.svg from its results.
# BENCHTIME is the length of each of the matrix's runs (one run per
# workload and system); at 4s the matrix takes about two minutes on 2 cores.
BENCHTIME ?= 4s

bench: redis
	$(GO) test -run '^$$' -bench . -benchmem ./leases/... ./client/
	RATELEASE_BENCH_REPORT=$(CURDIR) $(GO) test -run '^$$' -bench Compare -benchtime $(BENCHTIME) -timeout 15m ./e2e/compare/

# Run every Fuzz target of every package for $(FUZZTIME) each. `go test -list`
# prints each package's matching names followed by its "ok <package>" line;
# -fuzz needs one package and one target at a time.
fuzz:
	@list=$$($(GO) test -list '^Fuzz' ./...) || { echo "$$list" >&2; exit 1; }; \
	targets=$$(echo "$$list" | awk '/^Fuzz/ { names[n++] = $$1; next } /^ok[ \t]/ { for (i = 0; i < n; i++) print $$2, names[i]; n = 0 }'); \
	if [ -z "$$targets" ]; then echo "no Fuzz targets found"; exit 0; fi; \
	echo "$$targets" | while read -r pkg name; do \
		echo "== $$pkg $$name (fuzztime $(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) "$$pkg" || exit 1; \
	done

build:
	$(GO) build ./...
	$(GO) build -o bin/rateleased ./server/cmd/rateleased

clean:
	rm -rf bin/ coverage* *.out *.test
