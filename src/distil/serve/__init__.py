"""`distil serve-teacher`: a teacher model behind the subset of vLLM's OpenAI-compatible API
that `teacher.url` reads (token-id prompts, `prompt_logprobs`, `/v1/models`, `/health`).

`scoring.py` runs the transformers forward; `app.py` is the FastAPI app (the `serve` extra,
imported lazily); `cli.py` parses the command and runs uvicorn.
"""
