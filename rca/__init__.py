"""Root-cause analysis: deterministic classification of evidence (and, where configured, an LLM narrative)."""
