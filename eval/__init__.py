"""Retrieval evaluation against a real stack: LoCoMo conversations replayed through the public API
(``make eval``; see eval/README.md)."""
