"""OpenTelemetry export of trace hops and channel metrics (needs ``ezflow[otel]``; the
public surface is :mod:`ezflow.otel`)."""
