# Tools are pinned in their own modules under tools/ and run with `go tool`,
# outside the workspace (GOWORK=off: go.work lists the coordinator, gen and the
# Go SDK only, and the go command refuses -modfile in workspace mode). buf is
# the exception: the prebuilt binary of its npm package, pinned with the
# TypeScript client's dev dependencies (clients/node/package.json, `npm ci`
# there first), the same release that building it from source gave in over
# two minutes on a fresh machine.
# The tests also need Debian packages (MariaDB's server, Chromium, jq):
# `make test` installs those that are missing (.ci/deps).
BUF_BIN := $(CURDIR)/clients/node/node_modules/.bin/buf
# GOWORK=off reaches the Go plugins buf.gen.yaml runs with `go tool -modfile`.
BUF     := GOWORK=off $(BUF_BIN)
GRPCURL := GOWORK=off go tool -modfile=tools/grpcurl/go.mod grpcurl
# The Go packages of the workspace's three modules: `./...` alone stops at
# the nested modules gen/ and clients/go/ (see clients/go/README.md).
GO_PKGS := ./... ./gen/... ./clients/go/...

.PHONY: all help generate generate-node generate-python lint test test-fast run check-generated buf-installed

all: generate lint test

## help: list these targets
help:
	@sed -n 's/^## //p' $(MAKEFILE_LIST)

## generate: regenerate gen/, clients/node/src/gen/ and the Python client's generated modules from proto/ (committed; CI fails on a diff); needs `npm ci` in clients/node (buf, protoc-gen-es)
generate: generate-node generate-python buf-installed
	$(BUF) generate

buf-installed:
	@test -x $(BUF_BIN) || { echo "buf comes with the TypeScript client's dev dependencies: run npm ci in clients/node first"; exit 1; }

## generate-node: regenerate the TypeScript client's clients/node/src/gen/ (needs `npm ci` in clients/node)
generate-node: buf-installed
	@test -x clients/node/node_modules/.bin/protoc-gen-es || { echo "run npm ci in clients/node first"; exit 1; }
	cd clients/node && $(BUF) generate

# The Python client's generated modules: protoc's built-in python and pyi
# generators and grpc_python_plugin, pinned to Debian bookworm's protoc 3.21
# (another protoc writes other bytes). jobfence/v1 lands in the package itself,
# so the plugin's absolute `from jobfence.v1 import` resolves; google.rpc
# (vendored under clients/python/proto) goes to jobfence/_googleapis.
PY_GEN := clients/python/src/jobfence/v1 clients/python/src/jobfence/_googleapis

## generate-python: regenerate the Python client's $(PY_GEN) (apt-get install protobuf-compiler protobuf-compiler-grpc)
generate-python: buf-installed
	@protoc --version 2>/dev/null | grep -q '^libprotoc 3\.21\.' && command -v grpc_python_plugin >/dev/null || \
	  { echo "generate-python needs protoc 3.21 and grpc_python_plugin: apt-get install protobuf-compiler protobuf-compiler-grpc"; exit 1; }
	rm -f $(addsuffix /*_pb2*.py*,$(PY_GEN)) clients/python/src/jobfence/_googleapis/google/rpc/*_pb2*.py*
	cd clients/python && $(BUF) generate && $(BUF) generate --template buf.gen.googleapis.yaml

## lint: buf lint, gofmt and go vet; needs `npm ci` in clients/node (buf)
lint: buf-installed
	$(BUF) lint
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v '^gen/'))" || { gofmt -l $$(git ls-files '*.go' | grep -v '^gen/'); exit 1; }
	go vet $(GO_PKGS)

## test: every test (go test of the workspace's three modules), after .ci/deps installs what they need and this machine lacks: mariadb-server, chromium, jq (apt-get; sudo when not root). MariaDB at 127.0.0.1:3306 when it answers, else a private one (JOBFENCE_TEST_MYSQL_DSN to change)
test:
	bash .ci/deps
	go test $(GO_PKGS)

## test-fast: go test -short of the same packages: every test but those that run the commands as processes, drive Chromium, start MariaDB servers of their own or run the soak (docs/TESTING.md, the inner loop); CI and make test run them all
test-fast:
	go test -short $(GO_PKGS)

## run: the coordinator on the embedded store
run:
	go run ./cmd/coordinator

## check-generated: fail if gen/, clients/node/src/gen/ or the Python client's generated modules are not what proto/ generates
check-generated: generate
	@git diff --exit-code --stat -- gen/ clients/node/src/gen/ $(PY_GEN) || { echo "generated code is stale: run make generate and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- gen/ clients/node/src/gen/ $(PY_GEN))" || { git status --porcelain -- gen/ clients/node/src/gen/ $(PY_GEN); echo "generated code has untracked files"; exit 1; }
