"""Model-facing shell: the provider clients (OpenAI and compatible servers, Anthropic, local
GGUF models) behind one streaming interface, the router that picks one by model string
(retries, fallback, circuit breaker), the model catalog (windows, prices) and the tokenizers."""
