"""google.rpc.Status and its error details, generated from the protos vendored
under clients/python/proto (Apache-2.0). Read them through jobfence._rpc, which
prefers googleapis-common-protos when it is installed."""
