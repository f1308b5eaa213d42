"""Core types every stage shares: the spec and its rules, errors, output layout, manifests, registry, host probe."""
