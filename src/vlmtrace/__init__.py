"""vlmtrace: memory-aware OpenTelemetry tracing for vision-language models served with LMDeploy.

    import vlmtrace
    vlmtrace.instrument()          # options: see README.md or `vlmtrace.config.Options`

Every keyword argument has an environment variable (`VLMTRACE_*`, or the standard `OTEL_*`).
`instrument()` uses the OpenTelemetry API only: its spans and metrics go to the provider passed in or
the global one (the application's, `opentelemetry-instrument`'s), and always to the journal.
`vlmtrace.configure(otlp_endpoint=...)` is the separate step that installs an SDK exporting OTLP, for
applications that set up none themselves (`pip install 'vlmtrace[otlp]'`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vlmtrace.instrumentation.instrumentor import Session

__version__ = "0.1.0"


def instrument(**options: Any) -> Session | None:
    """Wrap LMDeploy and start tracing; a second call returns the running session unchanged."""
    from vlmtrace.instrumentation.instrumentor import LMDeployInstrumentor

    instrumentor = LMDeployInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        return LMDeployInstrumentor.session
    return instrumentor.instrument(skip_dep_check=True, **options)


def configure(otlp_endpoint: str | None = None, **settings: Any) -> Any:
    """Install an OpenTelemetry SDK TracerProvider and MeterProvider exporting OTLP as the global ones, and
    return the TracerProvider: yours from now on (see `vlmtrace.export.configure.configure`)."""
    from vlmtrace.export.configure import configure as configure_export

    return configure_export(otlp_endpoint, **settings)


def flush(timeout_s: float = 5.0) -> bool:
    """Hand every span ended so far to the exporters and wait (at most `timeout_s`) until they took it."""
    from vlmtrace.instrumentation.instrumentor import LMDeployInstrumentor

    session = LMDeployInstrumentor.session
    return session.flush(timeout_s) if session is not None else True


def uninstrument() -> None:
    """Put every wrapped LMDeploy function back, flush the exporters and close the journal."""
    from vlmtrace.instrumentation.instrumentor import LMDeployInstrumentor

    instrumentor = LMDeployInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()


__all__ = ["__version__", "configure", "flush", "instrument", "uninstrument"]
