"""Shared fixtures. Each fixture module under tests/fixtures/ is imported here."""
