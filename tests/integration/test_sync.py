"""The test command fails when notebooks and library disagree, or notebooks are not clean."""
import json, shutil, subprocess, sys
from conftest import ROOT
from check_sync import check_sync


def _copy(tmp_path):
    dst = tmp_path / "proj"
    dst.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", dst / "pyproject.toml")
    for d in ("nbs", "scope_nb"): shutil.copytree(ROOT / d, dst / d, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def _run_check(root):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "check_sync.py"), str(root)], capture_output=True, text=True)


def test_repo_is_in_sync():
    assert check_sync(ROOT) == []


def test_fresh_copy_passes(tmp_path):
    r = _run_check(_copy(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "notebooks clean" in r.stdout


def test_notebook_changed_without_export_fails(tmp_path):
    root = _copy(tmp_path)
    nb_path = root / "nbs" / "core" / "01_dialogue.ipynb"
    nb = json.loads(nb_path.read_text())
    nb["cells"].append({"cell_type": "code", "execution_count": None, "id": "0badc0de", "metadata": {}, "outputs": [],
                        "source": ["#| export\n", "def brand_new_helper(): return 42"]})
    nb_path.write_text(json.dumps(nb, indent=1) + "\n")
    r = _run_check(root)
    assert r.returncode == 1
    assert "scope_nb/core/dialogue.py: out of date" in r.stderr
    assert "brand_new_helper" not in (root / "scope_nb" / "core" / "dialogue.py").read_text()  # the check never edits the tree


def test_hand_edited_library_fails(tmp_path):
    root = _copy(tmp_path)
    lib = root / "scope_nb" / "core" / "models.py"
    lib.write_text(lib.read_text() + "\nHAND_EDIT = 1\n")
    assert any(p.startswith("scope_nb/core/models.py") for p in check_sync(root))


def test_unclean_notebook_fails(tmp_path):
    root = _copy(tmp_path)
    nb_path = root / "nbs" / "core" / "02_models.ipynb"
    nb = json.loads(nb_path.read_text())
    code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    code["execution_count"] = 7
    code["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["left over\n"]}]
    nb_path.write_text(json.dumps(nb, indent=1) + "\n")
    problems = check_sync(root)
    assert any(p.startswith("nbs/core/02_models.ipynb") for p in problems), problems
