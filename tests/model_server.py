"""The scripted model server the tests use lives in ``tools.model_server`` (one implementation,
shared with the offline model ``tools.model_stub``); this name stays for the tests, eval and bench."""

from __future__ import annotations

from tools.model_server import (
    CHAT_PATHS,
    DEFAULT_REPLY_TEXT,
    TASK_HEADER,
    ModelServer,
    Recorded,
    Reply,
    ToolCall,
)

__all__ = ["CHAT_PATHS", "DEFAULT_REPLY_TEXT", "TASK_HEADER", "ModelServer", "Recorded", "Reply", "ToolCall"]
