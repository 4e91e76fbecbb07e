"""llmgwd's admin API /api/v1: one module per resource, base (context, errors, bodies) and access
(its two ways of auth)."""
