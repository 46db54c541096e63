"""The codec library: index and value codecs (one a file, registered by id), the base classes
and registry, the choice of codecs per tensor, value arrangements and SparseCodec."""
