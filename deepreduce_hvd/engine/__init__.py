"""The native engine and its numpy twins: bit streams, halves, scatter-add, norms."""
