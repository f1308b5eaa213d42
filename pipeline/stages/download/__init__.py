"""Download stage: a Hub snapshot (verified, locked revision) or a generated tiny model."""
