"""The compressor and memory roles: sparsifiers, error feedback and the Pipeline that joins them to a codec."""
