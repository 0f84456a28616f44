"""The FastAPI app of `distil serve-teacher`: vLLM's answer format, for the part distil reads.

  GET  /health          200 {} (no key needed, as vLLM's)
  GET  /v1/models       {"object": "list", "data": [{"id": NAME, "max_model_len", ...}]}
  POST /v1/completions  token-id prompts (one list or a list of lists), `prompt_logprobs: K`
                        (0..--max-logprobs, no cap with -1), `max_tokens` 1 (nothing is
                        generated: `text` is ""; 0 is refused, as vLLM does), each choice
                        with `prompt_logprobs` as vLLM's; a prompt needs room for that one
                        token within `max_model_len` (as vLLM: at most max_model_len - 1)

Mistakes get a 4xx with `{"error": {"message", "type", "code"}}` (vLLM's shape) and the
server stays up: 400 for a malformed body or a bad value, 401 for a missing or wrong bearer
token, 404 for another model name, 413 for a request over the size limits.
"""

from __future__ import annotations

import hmac
import time
import uuid
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from distil.errors import require


class CompletionRequest(BaseModel):
    """The fields of vLLM's completion request that this server reads."""

    model_config = ConfigDict(extra="ignore")  # other OpenAI/vLLM fields do not matter here
    model: str | None = None
    prompt: list[list[int]] | list[int]
    max_tokens: int | None = 16
    prompt_logprobs: int | None = None
    stream: bool = False


@dataclass(frozen=True)
class Limits:
    max_logprobs: int = 20  # largest prompt_logprobs a request may ask for (vLLM's); -1: no cap
    max_tokens_per_request: int = 65536  # prompt tokens over all prompts of one request
    max_body_bytes: int = 16 << 20  # the request body, checked before it is parsed


def build_app(scorer, *, model_name: str, api_key: str | None, limits: Limits, max_model_len=None):
    """The app serving `scorer` (a `PromptScorer`) as `model_name`."""
    fastapi = require("fastapi", "serve", "distil serve-teacher")
    app = fastapi.FastAPI(title="distil serve-teacher", docs_url=None, redoc_url=None)
    _add_guards(app, api_key, limits)

    @app.get("/health")
    def health():
        return {}

    @app.get("/v1/models")
    def models():
        card = {
            "id": model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "distil",
            "root": model_name,
            "vocab_size": scorer.vocab_size,
        }
        if max_model_len is not None:  # vLLM's card has it; a client checks its lengths
            card["max_model_len"] = max_model_len
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    def completions(req: CompletionRequest):
        problem = check_request(req, model_name, scorer.vocab_size, limits, max_model_len)
        if problem is not None:
            return error(*problem)
        prompts = _prompts(req)
        scored = scorer.score(prompts, req.prompt_logprobs or 0)
        return _completion_response(req, prompts, scored, model_name)

    return app


def error(status: int, message: str):
    """The OpenAI-style error body with `status`."""
    from fastapi.responses import JSONResponse

    kind = {401: "Unauthorized", 404: "NotFoundError", 413: "RequestTooLarge"}
    body = {"message": message, "type": kind.get(status, "BadRequestError"), "code": status}
    return JSONResponse({"error": body}, status_code=status)


def _add_guards(app, api_key: str | None, limits: Limits) -> None:
    """Errors as OpenAI-style bodies; the API key and the body size checked before a route runs."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc):  # an unreadable body, an unknown route, ...
        return error(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def _malformed(request, exc):
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        if loc[:1] == ["prompt"]:
            return error(
                400,
                "prompt: this server takes token-id prompts only (a list of ints "
                "or a list of lists of ints), not text",
            )
        return error(400, f"malformed request: {'.'.join(loc) or 'body'}: {first.get('msg')}")

    @app.middleware("http")
    async def _guard(request, call_next):
        if request.url.path.startswith("/v1/"):
            if api_key is not None and not hmac.compare_digest(
                request.headers.get("authorization", ""), f"Bearer {api_key}"
            ):
                return error(401, "missing or wrong API key (Authorization: Bearer <key>)")
            size = request.headers.get("content-length")
            if size is not None and size.isdigit() and int(size) > limits.max_body_bytes:
                return error(413, f"request body of {size} bytes over {limits.max_body_bytes}")
        return await call_next(request)


def _completion_response(req, prompts, scored, model_name: str):
    """The /v1/completions answer: one choice per prompt with its prompt log-probs."""
    from fastapi.responses import JSONResponse

    choices = [
        {
            "index": i,
            "text": "",
            "logprobs": None,
            "finish_reason": "length",
            "prompt_logprobs": entries if req.prompt_logprobs is not None else None,
        }
        for i, entries in enumerate(scored)
    ]
    tokens = sum(len(p) for p in prompts)
    # plain json.dumps: FastAPI's encoder would walk every one of the T * K entries
    return JSONResponse(
        {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": choices,
            "usage": {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens},
        }
    )


def check_request(req, model_name: str, vocab_size: int, limits: Limits, max_model_len=None):
    """(status, message) for a request this server will not score, else None."""
    if req.model is not None and req.model != model_name:
        return 404, f"The model `{req.model}` does not exist (this server serves {model_name!r})."
    if req.stream:
        return 400, "`prompt_logprobs` are not available when `stream=True`."
    if req.max_tokens is not None and req.max_tokens < 1:
        return 400, f"max_tokens must be at least 1, got {req.max_tokens}."  # vLLM's answer
    if req.max_tokens != 1:
        return 400, f"max_tokens = {req.max_tokens}: this server scores prompts only (give 1)."
    k = req.prompt_logprobs
    cap = vocab_size if limits.max_logprobs == -1 else min(limits.max_logprobs, vocab_size)
    if k is not None and not 0 <= k <= cap:
        return 400, (
            f"Requested prompt logprobs of {k}, which is greater than max allowed: "
            f"{cap} (restart with --max-logprobs to allow more, -1 for no cap)"
            if k > 0
            else f"`prompt_logprobs` must be a positive value, got {k}."
        )
    prompts = _prompts(req)
    if not prompts or any(len(p) == 0 for p in prompts):
        return 400, "every prompt needs at least one token id"
    total = sum(len(p) for p in prompts)
    if total > limits.max_tokens_per_request:
        return 413, (
            f"{total} prompt tokens in one request, over the limit of "
            f"{limits.max_tokens_per_request} (--max-tokens-per-request); send fewer sequences"
        )
    longest = max((len(p) for p in prompts), default=0)
    if max_model_len is not None and longest + 1 > max_model_len:
        return 400, (  # vLLM's wording: the prompt and its one token must fit
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {longest + 1} tokens ({longest} in the messages, 1 in the completion)."
        )
    bad = next((t for p in prompts for t in p if not 0 <= t < vocab_size), None)
    if bad is not None:
        return 400, f"Token id {bad} is out of vocabulary (the model has {vocab_size} tokens)."
    return None


def _prompts(req: CompletionRequest) -> list[list[int]]:
    """The request's prompts as a list of id lists (one list of ints is one prompt)."""
    return req.prompt if req.prompt and isinstance(req.prompt[0], list) else [req.prompt]
