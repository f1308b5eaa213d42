"""Command-line wiring: flag definitions, error-to-exit mapping and the command bodies the invoke tasks call."""
