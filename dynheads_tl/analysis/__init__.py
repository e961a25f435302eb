"""Analyses of traces: dynamism metrics and static scores, CCA and probes. Reads ``Trace``s, never the model."""
