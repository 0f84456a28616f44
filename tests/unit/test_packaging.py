"""The build metadata: the license is an SPDX expression (a table makes setuptools print its
deprecation banner on every build), with a setuptools that reads that form."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_license_is_an_spdx_string_for_a_setuptools_that_reads_it():
    meta = tomllib.loads(PYPROJECT.read_text())
    assert meta["project"]["license"] == "Apache-2.0"
    (setuptools,) = [r for r in meta["build-system"]["requires"] if r.startswith("setuptools")]
    assert int(re.search(r">=\s*(\d+)", setuptools).group(1)) >= 77  # PEP 639 support
