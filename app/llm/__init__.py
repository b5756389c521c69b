"""Model-facing shell: tokenizers (and, later, provider clients)."""
