"""The project's form: import-linter's layers, one installed top-level module, a small public
surface that loads no training, benchmark or monitoring code, and every Python block of the
README and of the docs, run."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from importlinter.cli import lint_imports

import specdec_fast

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_import_contracts_hold():
    """The layers of docs/design.md (pyproject.toml's contracts): a lower layer never imports a higher one."""
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True) == 0


def test_the_installed_distribution_has_one_top_level_module():
    """specdec_fast only: the Triton kernels install as specdec_fast._triton, not as a module named
    triton_kernels (the name of a package triton publishes)."""
    dist = importlib.metadata.distribution("specdec_fast")
    assert dist.read_text("top_level.txt").split() == ["specdec_fast"]
    assert importlib.import_module("specdec_fast._triton").__name__ == "specdec_fast._triton"


@pytest.mark.slow
def test_the_wheel_has_one_top_level_module(tmp_path):
    """A non-editable install: the wheel holds specdec_fast (with _triton and the kernel sources) and its metadata only."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
                    str(ROOT)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("specdec_fast-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"specdec_fast", f"specdec_fast-{specdec_fast.__version__}.dist-info"}
    assert {"specdec_fast/_triton/verify.py", "specdec_fast/csrc/cpu/ops.cpp", "specdec_fast/data/policy.safetensors"} <= set(names)


def test_import_loads_the_core_api_only():
    code = "import sys, specdec_fast; print(' '.join(sorted(m for m in sys.modules if m.startswith('specdec_fast'))))"
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    assert "specdec_fast.decoding.speculative" in loaded
    heavy = [m for m in loaded if re.match(r"specdec_fast\.(training|bench|cli|policies\.monitoring)\b", m)]
    assert heavy == [], f"import specdec_fast loaded {heavy}"
    assert len(specdec_fast.__all__) <= 21 and all(hasattr(specdec_fast, name) for name in specdec_fast.__all__)


def test_names_users_already_use_still_import():
    """The names import specdec_fast exported before the layout change, the seed's included."""
    for name in specdec_fast._MODULE_OF:
        assert getattr(specdec_fast, name).__name__ == name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        specdec_fast.nope  # noqa: B018


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.M | re.S)


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300
    assert python_blocks(ROOT / "README.md"), "the README shows the API"


@pytest.mark.slow
@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_python_blocks_run(path, tmp_path, monkeypatch):
    """Every Python block of the file, in order, in one namespace (later blocks use earlier names)."""
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"docs_{path.stem}"}
    for i, block in enumerate(python_blocks(path)):
        exec(compile(block, f"{path.name}[block {i}]", "exec"), namespace)
