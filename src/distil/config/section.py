"""The base of every config section: unknown keys are errors, values are checked on
assignment, inf/nan are refused."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

Dtype = Literal["float32", "bfloat16", "float16", "auto"]


class Section(BaseModel):
    # inf/nan are never meant (train.lr=.inf passes gt=0); null says "no limit" where one exists
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, populate_by_name=True, allow_inf_nan=False
    )
