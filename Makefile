# allot — see README.md. `make run` is the one-machine demo, `make test` the
# full suite (it installs and starts the servers the tests need).
GO      ?= go
PKGS    ?= ./...
BENCH   ?= .
PROTOS  := $(shell find api -name '*.proto' 2>/dev/null)

# Pinned Go tools, installed through the Go module proxy into GOBIN_DIR when
# missing or built from another version (see `gotool`). protoc-gen-go matches
# google.golang.org/protobuf in go.mod, so the generated code uses only what
# that runtime supports without deprecation.
GOBIN_DIR                  := $(firstword $(subst :, ,$(shell $(GO) env GOPATH)))/bin
STATICCHECK_VERSION        := v0.8.2
GOSEC_VERSION              := v2.30.0
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2

# gotool installs package $(2) at version $(3) as GOBIN_DIR/$(1) unless the
# binary there was built from exactly that module version.
gotool = $(GO) version -m $(GOBIN_DIR)/$(1) 2>/dev/null | awk '$$1 == "mod" { print $$3 }' | grep -qx '$(3)' || \
	GOBIN=$(GOBIN_DIR) $(GO) install $(2)@$(3)

.PHONY: all build test test-short bench bench-peers lint run proto sim mutants chaos chaos-short clean

all: lint build

build:
	$(GO) build $(PKGS)

## test: install redis-server/etcd when missing, start throwaway servers on
## loopback, run `go test -race ./...` against them, stop them on exit.
test:
	bash scripts/test.sh

## test-short: unit tests only, no servers.
test-short:
	$(GO) test -short $(PKGS)

## bench: the side-by-side benchmarks named in the issues (needs a Redis;
## scripts/test.sh starts one).
bench:
	BENCH_ONLY=1 BENCH='$(BENCH)' bash scripts/test.sh

## bench-peers: the agent beside envoyproxy/ratelimit and Gubernator, each
## started here (with its own redis-server on loopback) and driven by one
## generator; installs the peers first (go install, pinned, through the Go
## module proxy, into the user cache directory). PEERSFLAGS narrows it,
## e.g. PEERSFLAGS='-callers 32 -keys 1000'.
bench-peers:
	@command -v redis-server >/dev/null || (apt-get update && apt-get install -y redis-server)
	$(GO) run ./bench/peers -install $(PEERSFLAGS)

# GOSEC_EXCLUDE names the gosec rules left out tree-wide, each because every
# site shares one reason. A site with its own reason carries a
# `#nosec <rule> -- <reason>` comment instead.
#   G404 (math/rand): jitter, generated load, test data, simulation seeds
#        (replayable by design) and session numbers, which tell a speaker's
#        incarnations apart (regions prove who they are with mTLS or a
#        token); no secret, key or token comes from math/rand.
#   G304 (file path from a variable): every file read or created by path is
#        named by the operator (flags, the rules and budgets files, the
#        scenario files) or is the harness's own output directory; no path
#        comes from a request or a peer.
#   G204 (subprocess with variable arguments): only the harnesses start
#        processes (internal/testenv, chaos, bench/peers): redis-server,
#        etcd, the go command, the project's binaries and the peers, with
#        arguments they build themselves.
GOSEC_EXCLUDE := G404,G304,G204

## lint: gofmt, go vet, staticcheck and gosec (pinned above; gosec skips
## generated code and the rules in GOSEC_EXCLUDE), on both modules.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	cd deploy && $(GO) vet ./...
	@$(call gotool,staticcheck,honnef.co/go/tools/cmd/staticcheck,$(STATICCHECK_VERSION))
	$(GOBIN_DIR)/staticcheck $(PKGS)
	cd deploy && $(GOBIN_DIR)/staticcheck ./...
	@$(call gotool,gosec,github.com/securego/gosec/v2/cmd/gosec,$(GOSEC_VERSION))
	$(GOBIN_DIR)/gosec -quiet -exclude-generated -exclude=$(GOSEC_EXCLUDE) $(PKGS)
	cd deploy && $(GOBIN_DIR)/gosec -quiet -exclude-generated -exclude=$(GOSEC_EXCLUDE) ./...

## proto: regenerate committed gRPC code with Debian's protoc and the Go
## plugins pinned above.
proto:
	@command -v protoc >/dev/null || (apt-get update && apt-get install -y protobuf-compiler)
	@$(call gotool,protoc-gen-go,google.golang.org/protobuf/cmd/protoc-gen-go,$(PROTOC_GEN_GO_VERSION))
	@$(call gotool,protoc-gen-go-grpc,google.golang.org/grpc/cmd/protoc-gen-go-grpc,$(PROTOC_GEN_GO_GRPC_VERSION))
	protoc -I api --plugin=protoc-gen-go=$(GOBIN_DIR)/protoc-gen-go \
		--plugin=protoc-gen-go-grpc=$(GOBIN_DIR)/protoc-gen-go-grpc \
		--go_out=api --go_opt=paths=source_relative \
		--go-grpc_out=api --go-grpc_opt=paths=source_relative $(PROTOS)

## run: the demo; ARGS go to it, e.g. to record its decisions for the
## simulator: make run ARGS="-decision-log /tmp/demo/decisions.jsonl"
run:
	$(GO) run ./cmd/demo $(ARGS)

## sim: the whole scenario library; a table, sim-results.json and a
## self-contained sim-report.html (inline SVG, no network needed).
sim:
	$(GO) run ./cmd/sim -json sim-results.json -html sim-report.html sim/scenarios

## mutants: the catch table: each bug in mutants/*.patch applied to a
## temporary copy of the tree and the scenario library run on it (tight
## forms, full scale, seed 1); exits 1 when one is not caught (survivors.txt
## lists the known survivors). MUTANTSFLAGS narrows it, e.g.
## MUTANTSFLAGS='-only 04' or '-failfast'.
mutants:
	$(GO) run ./cmd/mutants $(MUTANTSFLAGS)

## chaos: the chaos harness's long form: every scenario in chaos/scenarios
## on real processes (about 70 s each; needs redis-server, redis-sentinel
## and etcd, which `make test` installs), each beside the simulator's run
## of the same file; tables on stdout, chaos-results.json. Exits 1 when a
## verdict differs from the one its file expects (known failures FAIL).
chaos:
	$(GO) run ./cmd/chaos -json chaos-results.json $(CHAOSFLAGS) chaos/scenarios

## chaos-short: the short form CI runs (about three minutes); the same as
## `go test -run ShortScenarios ./chaos`.
chaos-short:
	$(GO) run ./cmd/chaos $(CHAOSFLAGS) chaos/scenarios/short

clean:
	rm -rf bin sim-results.json sim-report.html chaos-results.json
