"""What each framework supplies to the framework-neutral core."""
