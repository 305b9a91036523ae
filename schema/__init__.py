"""Strawberry types, inputs, errors and the request context."""
