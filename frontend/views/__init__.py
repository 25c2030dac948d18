"""Console pages. Thin: they read through selectors and write through services."""
