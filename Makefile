# pgbaton — run `make help` for the targets.

SHELL := /bin/bash
GO ?= go
TOOLS := $(CURDIR)/.tools

# Pinned tool versions: `make tools` installs them into .tools/.
SQLC_VERSION        := v1.31.1
STATICCHECK_VERSION := v0.8.2
SQLC        := $(TOOLS)/sqlc-$(SQLC_VERSION)
STATICCHECK := $(TOOLS)/staticcheck-$(STATICCHECK_VERSION)

# Tests run with the race detector; TESTFLAGS adds to them (e.g. -run X -v).
TESTFLAGS ?=
BENCHFLAGS ?= -benchtime=2s -count=1

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help
	@echo "Usage: make <target>"
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-16s %s\n", $$1, $$2}'

.PHONY: demo
demo: ## Run the demo (throwaway PostgreSQL unless DATABASE_URL is set)
	$(GO) run ./cmd/pgbaton demo

.PHONY: test
test: ## Run all tests with -race (throwaway PostgreSQL unless PGBATON_TEST_DSN is set)
	$(GO) test -race -count=1 -timeout 20m $(TESTFLAGS) ./...

# Side-by-side benchmarks (bench/, a module of its own so that the peer
# libraries never enter go.mod): a durable throwaway PostgreSQL, then the
# report on stdout and in bench/RESULTS.md. Takes several minutes; run it
# on a quiet machine. BENCHARGS adds to it (e.g. -only Claim -runs 3).
BENCHARGS ?=

# The chaos suite (test/): the short run is part of `make test`; `make chaos`
# runs many seeds for longer. Each run prints one line:
#   chaos: seed S ops N faults F overlaps 0 stale_accepted 0 lost 0 doubled 0 max_takeover_ms X
# Replay a seed with: go test -run 'TestChaos$$' ./test/ -args -chaos.seed=S
CHAOS_SEEDS    ?= 8
CHAOS_DURATION ?= 2m
FUZZTIME       ?= 5s

.PHONY: chaos
chaos: ## Run the long chaos suite (CHAOS_SEEDS seeds of CHAOS_DURATION each)
	$(GO) test -race -count=1 -timeout 0 -v -run 'TestChaos$$' ./test/ -args -chaos.seeds=$(CHAOS_SEEDS) -chaos.duration=$(CHAOS_DURATION)

.PHONY: fuzz-short
fuzz-short: ## Run each fuzz target briefly (FUZZTIME each), after its seed corpus
	$(GO) test -run '^$$' -fuzz '^FuzzNameKey$$' -fuzztime=$(FUZZTIME) ./test/fuzz/
	$(GO) test -run '^$$' -fuzz '^FuzzNameValidation$$' -fuzztime=$(FUZZTIME) ./test/fuzz/
	$(GO) test -run '^$$' -fuzz '^FuzzCLIArgs$$' -fuzztime=$(FUZZTIME) ./cmd/pgbaton/

.PHONY: bench
bench: ## Side-by-side benchmarks vs raw pgx, go-pglock, River, gue, redislock; writes bench/RESULTS.md
	@mkdir -p $(TOOLS)
	cd bench && $(GO) build -o $(TOOLS)/pgbaton-bench .
	cd bench && $(GO) run github.com/pgbaton/pgbaton/internal/cmd/withpg -durable -set max_connections=1300 -- \
		$(TOOLS)/pgbaton-bench -out RESULTS.md $(BENCHARGS)

.PHONY: bench-smoke
bench-smoke: ## Build, vet and smoke-test bench/ (every scenario once, tiny; seconds)
	cd bench && $(GO) vet ./... && $(GO) test -count=1 ./...

.PHONY: bench-go
bench-go: ## Run the packages' Go benchmarks (ratios to raw pgx in the same run)
	$(GO) test -run '^$$' -bench . $(BENCHFLAGS) ./...

.PHONY: generate
generate: $(SQLC) ## Regenerate the sqlc code in internal/db from queries/ and migrations/
	$(SQLC) generate

.PHONY: check-generated
check-generated: generate ## Fail if the committed sqlc output differs from a fresh generation
	@if [ -n "$$(git status --porcelain -- internal/db)" ]; then \
		echo "internal/db differs from a fresh 'make generate':"; git status --porcelain -- internal/db; git --no-pager diff --stat -- internal/db; exit 1; \
	fi
	@echo "generated code is up to date"

.PHONY: vet-sql
vet-sql: $(SQLC) ## Run sqlc vet (db-prepare) against a throwaway migrated PostgreSQL
	$(GO) run ./internal/cmd/withpg -sql cmd/pgbaton/demo_schema.sql -- $(SQLC) vet

.PHONY: lint
lint: $(STATICCHECK) ## gofmt, go mod tidy check, go vet and staticcheck
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@$(GO) mod tidy -diff || { echo "go.mod/go.sum are not tidy: run make tidy"; exit 1; }
	@cd bench && $(GO) mod tidy -diff || { echo "bench/go.mod/go.sum are not tidy: run make tidy"; exit 1; }
	$(GO) vet ./...
	$(STATICCHECK) ./...

.PHONY: tidy
tidy: ## go mod tidy (root module and bench/)
	$(GO) mod tidy
	cd bench && $(GO) mod tidy

.PHONY: tools
tools: $(SQLC) $(STATICCHECK) ## Install the pinned tools into .tools/

$(SQLC):
	@mkdir -p $(TOOLS)
	GOBIN=$(TOOLS) $(GO) install github.com/sqlc-dev/sqlc/cmd/sqlc@$(SQLC_VERSION)
	mv $(TOOLS)/sqlc $@

$(STATICCHECK):
	@mkdir -p $(TOOLS)
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(TOOLS)/staticcheck $@
