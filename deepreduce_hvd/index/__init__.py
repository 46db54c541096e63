"""Index codecs; importing this package registers them all."""
from . import bitmap, bloom, deflate, entropy, golomb, huffman, raw, rle, seeded, varint  # noqa: F401
