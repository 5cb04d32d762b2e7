"""The layering of the code, held by import-linter (its contracts are in pyproject.toml):
the layers, plugins that import only the public plugin API, a client library without the
command line, and the folders imported only as device_loop's subpackages."""
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import SRC

pytestmark = pytest.mark.service  # (import-linter runs as a process)


def test_each_layer_imports_only_the_layers_below_it():
    lint = Path(sys.executable).parent / "lint-imports"
    contracts = tomllib.loads((SRC / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    result = subprocess.run([str(lint), "--config", str(SRC / "pyproject.toml")], cwd=SRC, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert len(contracts) == 4 and f"{len(contracts)} kept, 0 broken" in result.stdout, result.stdout[-3000:]
    assert {"device_loop.client": ["click"]}.items() <= {
        source: c["forbidden_modules"] for c in contracts if c["type"] == "forbidden"
        for source in c["source_modules"]}.items(), "the client library may import click"
