# prefixd build, test and benchmark targets. Run `make help` for a list.

GO            ?= go
BIN           ?= bin
GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT := $(BIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
FUZZTIME      ?= 50000x
RUN_ARGS      ?= serve

.PHONY: help build test fuzz bench lint fmt generate verify run clean deps

help:
	@echo "targets: build test fuzz bench lint fmt generate verify run clean deps"

build:
	$(GO) build -o $(BIN)/prefixd ./cmd/prefixd

# deps installs what the tests need on a fresh Debian machine (as root).
deps:
	bash scripts/test-deps.sh

# test checks formatting and vet, runs every test with the race detector,
# then each fuzz target briefly.
test:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
		if [ -n "$$unformatted" ]; then echo "not gofmt-ed: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...
	$(MAKE) --no-print-directory fuzz

# fuzz runs each fuzz target for FUZZTIME inputs (make fuzz FUZZTIME=10m for longer).
fuzz:
	bash scripts/fuzz.sh $(FUZZTIME)

# bench runs the benchmarks and regenerates BENCHMARKS.md.
bench:
	bash scripts/bench.sh

$(GOLANGCI_LINT):
	GOBIN=$(abspath $(BIN))/golangci-lint-tmp $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(BIN)/golangci-lint-tmp/golangci-lint $@ && rmdir $(BIN)/golangci-lint-tmp

lint: $(GOLANGCI_LINT)
	$(GO) vet ./...
	$(GOLANGCI_LINT) run ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

# generate regenerates generated code. The .proto files are compiled by
# protoc (Debian's protobuf-compiler, pinned to PROTOC_VERSION: its version
# is written into the generated files) with the Go plugins pinned as go
# tools in go.mod (protoc-gen-go, protoc-gen-go-grpc).
PROTOC         ?= protoc
PROTOC_VERSION := 3.21.12
PROTO_FILES    := $(shell find proto -name '*.proto' 2>/dev/null | sort)

generate:
	$(GO) generate ./...
	@$(PROTOC) --version 2>/dev/null | grep -qx 'libprotoc $(PROTOC_VERSION)' || \
		{ echo "generate: need protoc $(PROTOC_VERSION) (apt-get install protobuf-compiler libprotobuf-dev on Debian bookworm); have: $$($(PROTOC) --version 2>&1)"; exit 1; }
	$(PROTOC) -I proto \
		--plugin=protoc-gen-go=$$($(GO) tool -n protoc-gen-go) \
		--plugin=protoc-gen-go-grpc=$$($(GO) tool -n protoc-gen-go-grpc) \
		--go_out=. --go_opt=module=github.com/prefixd/prefixd \
		--go-grpc_out=. --go-grpc_opt=module=github.com/prefixd/prefixd \
		$(PROTO_FILES)

# verify regenerates everything generated and fails if the tree changed.
verify: generate
	$(GO) mod tidy
	gofmt -l $$(git ls-files '*.go') | (! grep .)
	git diff --exit-code

run: build
	$(BIN)/prefixd $(RUN_ARGS)

clean:
	rm -rf $(BIN)
