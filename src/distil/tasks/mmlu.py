"""MMLU (cais/mmlu, subset "all", split "test"; the 5 examples per subject of split "dev" are the
shots): four-choice questions with `question`, `choices` (list), `answer` (index), `subject`.

The prompt follows the original MMLU format, k-shot (eval.num_fewshot, default 5): "The following
are multiple choice questions (with answers) about <subject>.", then the first k dev examples of
the same subject (in file order: deterministic) each ending "Answer: <letter>", then the question
ending "Answer:". The shots come from eval.fewshot_data (a file or hub id; null: the same hub
dataset as eval.data, split eval.fewshot_split); a local eval.data needs eval.fewshot_data or
eval.num_fewshot=0.

With eval.mmlu_scoring=loglik the letter is not generated: each choice's " A", " B", ... is
scored after the prompt as plain text (no chat template), and the most likely one is the answer,
as lm-evaluation-harness scores MMLU (eval/loglik.py), so the accuracy is comparable with its.
Otherwise the chosen letter is read from the generation: "Answer: B", "answer is (B)", "(B)", "B." or a
lone "B" at the start; the first of these patterns that matches wins (see `extract`). Outcomes:
correct, no_choice (no letter among the choices found), wrong_choice. The report adds the
accuracy per subject.
"""

from __future__ import annotations

import re
from typing import Any

from distil.errors import ConfigError, DataError
from distil.tasks.base import Task, Verdict, Where, field, read_task_rows

LETTERS = "ABCDEFGHIJ"


def _pattern(letters: str) -> list[re.Pattern]:
    c = f"[{letters}]"
    return [
        # optional parts one after another, never two \s* side by side: linear on runs of spaces
        re.compile(rf"(?i:answer)(?:\s+is)?(?:\s*:)?\s*\(?({c})\b"),  # Answer: B
        re.compile(rf"^\s*\(?({c})\)?(?:[.:)\s]|$)"),  # B. / (B) / B at the start
        re.compile(rf"\(({c})\)"),  # (B) anywhere
        re.compile(rf"(?:^|\s)({c})(?:[.)]|\s*$)", re.MULTILINE),  # a lone letter
    ]


def extract(completion: str, n_choices: int) -> str | None:
    """The chosen letter (upper case), or None."""
    for pattern in _pattern(LETTERS[:n_choices]):
        found = pattern.findall(completion)
        if found:
            return found[0].upper()
    return None


def format_question(problem: dict[str, Any]) -> str:
    lines = [problem["question"].strip()]
    lines += [f"{LETTERS[i]}. {c}" for i, c in enumerate(problem["choices"])]
    return "\n".join(lines) + "\nAnswer:"


class MMLU(Task):
    name = "mmlu"
    outcomes = ("correct", "no_choice", "wrong_choice")
    hub = ("cais/mmlu", "all", "test")

    def problem(self, row: dict[str, Any], where: Where) -> dict[str, Any]:
        question = field(row, "question", str, where)
        choices = field(row, "choices", list, where)
        answer = field(row, "answer", int, where)
        if not (2 <= len(choices) <= len(LETTERS)) or not all(isinstance(c, str) for c in choices):
            raise DataError(
                f"column 'choices' must be a list of 2 to {len(LETTERS)} strings, got "
                f"{len(choices)} items",
                **where,
            )
        if not 0 <= answer < len(choices):
            raise DataError(
                f"column 'answer' must index 'choices' (0..{len(choices) - 1}), got {answer}",
                **where,
            )
        subject = row.get("subject") if isinstance(row.get("subject"), str) else ""
        return {
            "question": question,
            "choices": list(choices),
            "answer": answer,
            "subject": subject,
        }

    def load(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        problems, info = super().load()
        shots = self._shots()
        for p in problems:
            p["_shots"] = shots.get(p["subject"], [])[: self.cfg.num_fewshot]
        if self.cfg.num_fewshot:
            info["fewshot"] = {"k": self.cfg.num_fewshot, **self._fewshot_source}
        return problems, info

    def _shots(self) -> dict[str, list[dict[str, Any]]]:
        """Dev examples by subject, in file order."""
        cfg = self.cfg
        self._fewshot_source: dict[str, Any] = {}
        if not cfg.num_fewshot:
            return {}
        source, subset, split = cfg.fewshot_data, cfg.subset, cfg.fewshot_split
        if source is None:
            from distil.paths import looks_local

            data = cfg.data or self.hub[0]
            if cfg.data is None:
                subset = cfg.subset or self.hub[1]
            if looks_local(data):
                raise ConfigError(
                    f"eval.task=mmlu with the local file eval.data={data} needs the k-shot "
                    f"examples: set eval.fewshot_data to a file of MMLU dev rows (same columns), "
                    "or eval.num_fewshot=0 for zero-shot"
                )
            source = data
        rows, info = read_task_rows(source, split=split, subset=subset)
        self._fewshot_source = {k: v for k, v in info.items() if k in ("path", "hub", "sha256")}
        by_subject: dict[str, list[dict[str, Any]]] = {}
        for i, (where, row) in enumerate(rows):
            shot = self.make_problem(row, where, i)
            by_subject.setdefault(shot["subject"], []).append(shot)
        return by_subject

    def messages(self, problem: dict[str, Any]) -> list[dict[str, str]]:
        subject = problem["subject"].replace("_", " ")
        head = "The following are multiple choice questions (with answers)"
        parts = [f"{head} about {subject}." if subject else f"{head}."]
        for shot in problem.get("_shots", []):
            parts.append(f"{format_question(shot)} {LETTERS[shot['answer']]}")
        parts.append(format_question(problem))
        return [{"role": "user", "content": "\n\n".join(parts)}]

    @property
    def scoring(self) -> str:
        return self.cfg.mmlu_scoring

    def choice_prompt(self, problem: dict[str, Any]) -> tuple[str, list[tuple[str, str]]]:
        """lm-eval's MMLU request: the k-shot prompt as text, continuations " A", " B", ..."""
        letters = LETTERS[: len(problem["choices"])]
        return self.messages(problem)[0]["content"], [(f" {x}", x) for x in letters]

    def check(self, completion: str, problem: dict[str, Any]) -> Verdict:
        letter = extract(completion, len(problem["choices"]))
        if letter is None:
            return Verdict("no_choice", None, "no answer letter found")
        gold = LETTERS[problem["answer"]]
        if letter != gold:
            return Verdict("wrong_choice", letter, f"{letter} != {gold}")
        return Verdict("correct", letter, "")

    def group(self, problem: dict[str, Any]) -> str | None:
        return problem["subject"] or None
