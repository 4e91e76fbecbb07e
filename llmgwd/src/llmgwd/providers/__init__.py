"""External providers: models served by an upstream API (OpenAI-compatible or Anthropic)."""
