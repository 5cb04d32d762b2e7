"""The layering of the code, held by import-linter (its contract is in pyproject.toml)."""
import subprocess
import sys
from pathlib import Path

from conftest import SRC


def test_each_layer_imports_only_the_layers_below_it():
    lint = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint), "--config", str(SRC / "pyproject.toml")], cwd=SRC, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "1 kept, 0 broken" in result.stdout
