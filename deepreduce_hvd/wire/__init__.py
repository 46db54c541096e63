"""The wire format: byte fields, the self-describing payload, and the frames ranks exchange."""
