"""vlmtrace: memory-aware OpenTelemetry tracing for vision-language models served with LMDeploy."""

__version__ = "0.1.0"
