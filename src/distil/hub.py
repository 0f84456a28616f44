"""Upload a trained student to the Hugging Face Hub with its model card: `distil push RUN_DIR
--repo ID`, and `train.push_to_hub` at the end of training.

What goes up is `RUN_DIR/final` as training saved it (weights, tokenizer, generation config,
distil's model metadata, the resolved config `distil_config.yaml`) with its README.md, the
model card, written again first with the repo id as its title (train/card.py). The repo is
created when it does not exist. The token is huggingface_hub's: HF_TOKEN or `hf auth login`.
"""

from __future__ import annotations

from pathlib import Path

from distil.errors import DistilError
from distil.files import atomic_write
from distil.train.card import CONFIG_FILE, run_card


class HubError(DistilError):
    """The Hub refused an upload or could not be reached."""


def push_run(
    run_dir: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    token: str | None = None,
    message: str | None = None,
) -> str:
    """Upload `run_dir/final` (with a fresh model card) to the model repo `repo_id`; returns
    the repo's URL."""
    final = _final_dir(Path(run_dir))
    card = run_card(run_dir, title=repo_id)
    atomic_write(final / "README.md", lambda tmp: Path(tmp).write_text(card, encoding="utf-8"))
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(token=token)
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True)
        api.upload_folder(
            repo_id=url.repo_id,
            folder_path=final,
            commit_message=message or f"distil: {Path(run_dir).name}",
        )
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise HubError(
            f"the Hub refused the upload to {repo_id!r} (HTTP {status}: "
            f"{_first_line(exc)}). Fix: log in with a token that may write to that "
            "namespace (`hf auth login`, or HF_TOKEN), and check the repo id"
        ) from exc
    except network_errors() as exc:  # offline mode, no network, a malformed repo id
        raise HubError(
            f"cannot upload to {repo_id!r} ({type(exc).__name__}: {_first_line(exc)}). "
            "Fix: check the repo id (org/name), the network and the endpoint (HF_ENDPOINT); "
            "HF_HUB_OFFLINE=1 forbids uploads"
        ) from exc
    return str(url)


def network_errors() -> tuple[type[BaseException], ...]:
    """What a failed connection raises in huggingface_hub: OSError and ValueError (offline
    mode, a malformed repo id) and its HTTP client's errors, which are neither (httpx2 in
    huggingface_hub 2.x, httpx in 1.x: a refused connection, a timeout)."""
    import importlib

    errors: list[type[BaseException]] = [OSError, ValueError]
    for module, name in (("httpx2", "HTTPError"), ("httpx", "HTTPError")):
        try:
            errors.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(errors)


def check_token(repo_id: str | None) -> None:
    """HubError before a run with train.push_to_hub starts when no Hub token is found (the
    upload at its end would fail after all the training)."""
    from huggingface_hub import get_token

    try:
        found = get_token()
    except Exception as exc:  # HF_OIDC_RESOURCE set and its token exchange failed
        raise HubError(
            f"train.push_to_hub=true: cannot get a Hugging Face token ({type(exc).__name__}: "
            f"{_first_line(exc)}). Fix: `hf auth login` or HF_TOKEN, or train.push_to_hub=false"
        ) from exc
    if not found:
        raise HubError(
            f"train.push_to_hub=true (repo {repo_id!r}) but no Hugging Face token is set, so "
            "the upload after training would fail. Fix: `hf auth login` or set HF_TOKEN to a "
            "token that may write there; or train.push_to_hub=false and `distil push RUN_DIR "
            "--repo ID` later"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text.strip() else repr(exc)


def _final_dir(run_dir: Path) -> Path:
    final = run_dir / "final"
    if not (final / "config.json").is_file() or not (final / CONFIG_FILE).is_file():
        raise HubError(
            f"{run_dir} holds no final model saved by this distil ({final}/config.json and "
            f"{CONFIG_FILE}). Fix: pass the run directory (train.output_dir) of a run that "
            "finished"
        )
    return final


def add_push(sub) -> None:
    p = sub.add_parser("push", help="upload a run's final model and its model card to the Hub")
    p.add_argument("run_dir", help="a run directory (train.output_dir) with final/")
    p.add_argument("--repo", required=True, help="Hub repo id, e.g. my-org/my-student")
    p.add_argument("--private", action="store_true", help="create the repo private")
    p.set_defaults(func=_push)


def _push(args) -> int:
    url = push_run(args.run_dir, args.repo, private=args.private)
    print(f"pushed {Path(args.run_dir) / 'final'} to {url}")
    return 0
