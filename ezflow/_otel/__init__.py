"""OpenTelemetry export of trace hops and channel metrics (needs ``ezflow-pubsub[otel]``; the
public surface is :mod:`ezflow.otel`)."""
