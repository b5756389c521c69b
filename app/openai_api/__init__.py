"""The OpenAI Responses and Conversations API over sessions and runs (/openai/v1)."""
