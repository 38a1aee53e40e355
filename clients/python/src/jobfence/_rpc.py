"""google.rpc.Status and its error details (ErrorInfo, BadRequest).

googleapis-common-protos, when installed, owns the ``google.rpc`` protos in
protobuf's default descriptor pool; loading a second copy of them there could
clash. So its modules are used when they can be imported, and the copy
generated from the protos vendored with this package (jobfence._googleapis)
otherwise. Both are the same messages on the wire.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._googleapis.google.rpc import error_details_pb2, status_pb2
else:
    try:
        from google.rpc import error_details_pb2, status_pb2
    except ImportError:
        from ._googleapis.google.rpc import error_details_pb2, status_pb2

__all__ = ["error_details_pb2", "status_pb2"]
