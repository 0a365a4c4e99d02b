# allot — see README.md. `make run` is the one-machine demo, `make test` the
# full suite (it installs and starts the servers the tests need).
GO      ?= go
PKGS    ?= ./...
BENCH   ?= .
PROTOS  := $(shell find api -name '*.proto' 2>/dev/null)

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

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	cd deploy && $(GO) vet ./...

## proto: regenerate committed gRPC code with Debian's protoc and Go plugins.
proto:
	@command -v protoc >/dev/null || (apt-get update && apt-get install -y protobuf-compiler protoc-gen-go protoc-gen-go-grpc)
	protoc -I api --go_out=api --go_opt=paths=source_relative \
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
