"""Evaluation tasks: prompt from a dataset row, answer from a completion, verdict with a category."""

from distil.tasks.base import Task, Verdict
from distil.tasks.registry import TASKS, get_task, make_task

__all__ = ["TASKS", "Task", "Verdict", "get_task", "make_task"]
