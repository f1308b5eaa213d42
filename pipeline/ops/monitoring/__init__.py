"""Watching a deployment's cost: Prometheus recording and alert rules, a Grafana dashboard, and a picture of it."""
