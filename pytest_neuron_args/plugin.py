"""pytest plugin entry point."""
