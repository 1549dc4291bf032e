"""Prometheus rules and what renders them for a site (generate.py); the rule files are YAML."""
