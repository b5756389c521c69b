"""Threadline: sessions for LLM agents; the journal is the history, the context a projection."""
