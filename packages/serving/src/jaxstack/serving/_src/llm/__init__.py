"""The LLM engine (paged KV cache, continuous batching, prefix caching) and its OpenAI server."""
