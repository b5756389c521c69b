"""HTTP layer: thin routes that parse, call a service, and map the result."""
