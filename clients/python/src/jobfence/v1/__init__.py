"""Generated code of proto/jobfence/v1/coordinator.proto (``make generate-python``).

``coordinator_pb2`` holds the messages and enums, ``coordinator_pb2_grpc`` the
service stub. The SDK (:mod:`jobfence`) wraps both; use them directly only for
calls it does not cover.
"""
