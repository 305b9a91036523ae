"""botmemory: a multi-tenant memory service for chat bots."""
