"""The memory Bot: model client, prompts and output models, the arq worker and its jobs."""
