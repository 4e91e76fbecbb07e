"""bench/: benchmarks that print figures; a package so that its scripts share modules."""
