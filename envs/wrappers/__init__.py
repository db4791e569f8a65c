"""Env wrappers."""
