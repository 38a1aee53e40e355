# Tools are pinned in their own modules under tools/ and run with `go tool`,
# so nothing needs installing beyond Go.
BUF     := go tool -modfile=tools/buf/go.mod buf
GRPCURL := go tool -modfile=tools/grpcurl/go.mod grpcurl

.PHONY: all generate generate-node lint test run check-generated

all: generate lint test

## generate: regenerate gen/ and clients/node/src/gen/ from proto/ (committed; CI fails on a diff)
generate: generate-node
	$(BUF) generate

## generate-node: regenerate the TypeScript client's clients/node/src/gen/ (needs `npm ci` in clients/node)
generate-node:
	@test -x clients/node/node_modules/.bin/protoc-gen-es || { echo "run npm ci in clients/node first"; exit 1; }
	cd clients/node && go tool -modfile=$(CURDIR)/tools/buf/go.mod buf generate

## lint: buf lint, gofmt and go vet
lint:
	$(BUF) lint
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v '^gen/'))" || { gofmt -l $$(git ls-files '*.go' | grep -v '^gen/'); exit 1; }
	go vet ./...

## test: every test; MySQL at 127.0.0.1:3306 is required (JOBFENCE_TEST_MYSQL_DSN to change)
test:
	go test ./...

## run: the coordinator on the embedded store
run:
	go run ./cmd/coordinator

## check-generated: fail if gen/ or clients/node/src/gen/ is not what proto/ generates
check-generated: generate
	@git diff --exit-code --stat -- gen/ clients/node/src/gen/ || { echo "generated code is stale: run make generate and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- gen/ clients/node/src/gen/)" || { git status --porcelain -- gen/ clients/node/src/gen/; echo "generated code has untracked files"; exit 1; }
