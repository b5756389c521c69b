"""What the tests and the benchmarks share to drive Threadline from outside: a fake LLM upstream
speaking the real OpenAI and Anthropic wire formats, an SSE reader, a uvicorn server in a
thread, API request helpers and a scripted long session.

Run from the checkout (pytest's rootdir, `python -m bench.…`); never shipped in the wheel.
"""
