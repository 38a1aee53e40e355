"""A stand-in for the ``opentelemetry-api`` package, for jobfence's tests.

PyPI cannot be reached where these tests run and Debian packages no
OpenTelemetry for Python, so the tests of jobfence.tracing (R35) put this
folder on sys.path. It has the names jobfence.tracing uses, with the real
API's signatures and behaviour as far as the SDK depends on them
(opentelemetry.context: Context, attach, detach, get_current;
opentelemetry.trace: the global provider, a no-op until one is set, spans,
span contexts, links, trace flags and state, status), and a provider that
records spans (standin_sdk.RecordingTracerProvider). With
JOBFENCE_OTEL_STANDIN_SPANS set to a file, importing opentelemetry.trace
sets the global provider to one that appends each ended span to that file
as a JSON line: how a worker process's spans reach a test.

What it does not show: that the real packages behave the same (their
samplers, the batch processor, exporters, resource detection, the OTLP
wire). clients/python/README.md, "Tracing", says what only a real install
exercises.
"""
