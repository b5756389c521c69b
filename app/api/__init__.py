"""The HTTP API: thin routes that parse a request, call a service and map its result (the native
/v1 API, the AI SDK chat routes, the admin API), their bodies, the one JSON error shape, the
caller's authentication, health and metrics probes, the API docs and the chat page. The OpenAI
Responses facade is app/openai_api."""
