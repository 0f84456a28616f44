"""`distil serve-teacher MODEL`: load a causal LM with transformers and serve its prompt
log-probs on 127.0.0.1 (by default) until stopped; `teacher.url` then points at it."""

from __future__ import annotations

import os
import sys

from distil.errors import ConfigError, require


def add_serve_teacher(sub, positive_int) -> None:
    p = sub.add_parser(
        "serve-teacher",
        help="serve a teacher's prompt log-probs (OpenAI-compatible, as vLLM) for teacher.url",
    )
    p.add_argument("model", help="model directory or hub id (also the served model name)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    p.add_argument("--port", type=positive_int, default=8000, help="port (default: 8000)")
    p.add_argument(
        "--api-key-env",
        default=None,
        metavar="VAR",
        help="require 'Authorization: Bearer <key>', the key read from this environment variable",
    )
    p.add_argument("--served-model-name", default=None, help="name in /v1/models (default: MODEL)")
    p.add_argument("--tokenizer", default=None, help="tokenizer path (default: MODEL)")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="weights dtype (default: the checkpoint's)",
    )
    p.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda if available)")
    p.add_argument(
        "--max-batch", type=positive_int, default=8, help="sequences per forward pass (default: 8)"
    )
    p.add_argument(
        "--max-tokens-per-request",
        type=positive_int,
        default=65536,
        help="prompt tokens over all prompts of one request (default: 65536)",
    )
    p.add_argument(
        "--max-logprobs",
        type=_logprobs_cap,
        default=20,
        help="largest prompt_logprobs a request may ask for (default: 20, as vLLM; -1: no cap)",
    )
    p.add_argument(
        "--max-model-len",
        type=positive_int,
        default=None,
        help="longest prompt + 1 token (default: the model's max_position_embeddings); sent in "
        "/v1/models as vLLM does",
    )
    p.set_defaults(func=_serve_teacher)


def _logprobs_cap(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < -1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number >= 0, or -1 for no cap")
    return value


def _serve_teacher(args) -> int:
    require("fastapi", "serve", "distil serve-teacher")
    uvicorn = require("uvicorn", "serve", "distil serve-teacher")
    import torch

    from distil.models.load import load_model, load_tokenizer
    from distil.serve.app import Limits, build_app
    from distil.serve.scoring import PromptScorer

    api_key = None
    if args.api_key_env is not None:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise ConfigError(
                f"--api-key-env {args.api_key_env}: that environment variable is not set or "
                f"empty. Fix: export {args.api_key_env}=<a secret key> before starting the "
                "server (the key is never taken from the command line)"
            )
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    tok = load_tokenizer(args.tokenizer or args.model, key="--tokenizer")
    model = load_model(args.model, key="MODEL", dtype=args.dtype, device=device)
    name = args.served_model_name or args.model
    limits = Limits(
        max_logprobs=args.max_logprobs, max_tokens_per_request=args.max_tokens_per_request
    )
    max_len = args.max_model_len or getattr(model.config, "max_position_embeddings", None)
    scorer = PromptScorer(model, tok, max_batch=args.max_batch)
    app = build_app(scorer, model_name=name, api_key=api_key, limits=limits, max_model_len=max_len)
    print(
        f"serving {name!r} ({scorer.vocab_size} tokens, {device}) on "
        f"http://{args.host}:{args.port}/v1"
        + (f" (key from ${args.api_key_env})" if api_key else ""),
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
