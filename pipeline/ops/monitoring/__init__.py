"""Watching a deployment: Prometheus recording and alert rules (operations and cost), a Grafana dashboard, and a
picture of it."""
