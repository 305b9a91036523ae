"""Record ids and API tokens."""

from __future__ import annotations

import hashlib
import secrets


def new_id(prefix: str) -> str:
    """A random id with a kind prefix, e.g. ``chat_3f9a…`` (128 bits)."""
    return f"{prefix}_{secrets.token_hex(16)}"


def new_token(prefix: str) -> tuple[str, str, str]:
    """A new API token: (token id, the secret token shown once, its hash as stored)."""
    token_id = new_id("tok")
    token = f"{prefix}_{secrets.token_urlsafe(32)}"
    return token_id, token, hash_token(token)


def hash_token(token: str) -> str:
    """Tokens carry 256 random bits, so one SHA-256 is a sufficient one-way store."""
    return hashlib.sha256(token.encode()).hexdigest()
