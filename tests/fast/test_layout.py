"""The layout check passes on the repository and fails on a deliberately wrong copy (an import between packages the
rule forbids, a forward import inside a package, by import or by string, a notebook in the wrong folder, a shared
notebook number, a stale line in the list of known forward imports)."""
import json, shutil, subprocess, sys
from conftest import ROOT


def _copy(tmp_path):
    dst = tmp_path / "proj"
    for d in ("nbs", "scope_nb", "tools"): shutil.copytree(ROOT / d, dst / d, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def _check(root):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "check_layout.py"), "--root", str(root)], capture_output=True, text=True)


def test_repository_layout_passes():
    r = _check(ROOT)
    assert r.returncode == 0, r.stdout


def test_import_between_packages_the_rule_forbids_fails(tmp_path):
    root = _copy(tmp_path)
    core = root / "scope_nb" / "core" / "dialogue.py"
    core.write_text(core.read_text() + "\n\ndef _late():\n    from ..train.run import train   # core reaching up into train\n")
    users = root / "scope_nb" / "users" / "simulators.py"   # users sits beside envs, not above it: a string counts too
    users.write_text(users.read_text() + '\n\nLATER = "scope_nb.envs.shop:ShopEnv"\n')
    r = _check(root)
    assert r.returncode == 1, r.stdout
    assert "scope_nb/core/dialogue.py" in r.stdout and "imports train.run (nbs/train/37_run.ipynb): package core may import no other package" in r.stdout, r.stdout
    assert "scope_nb/users/simulators.py" in r.stdout and "imports envs.shop (nbs/envs/34_shop.ipynb): package users may import core;" in r.stdout, r.stdout


def test_notebook_in_the_wrong_folder_fails(tmp_path):
    root = _copy(tmp_path)
    shutil.move(root / "nbs" / "envs" / "11_p4g.ipynb", root / "nbs" / "train" / "11_p4g.ipynb")
    r = _check(root)
    assert r.returncode == 1 and "nbs/train/11_p4g.ipynb exports envs.p4g: move the notebook to nbs/envs/" in r.stdout, r.stdout


def test_shared_number_and_stale_known_line_fail(tmp_path):
    root = _copy(tmp_path)
    shutil.copy2(root / "nbs" / "train" / "31_rollout.ipynb", root / "nbs" / "train" / "31_rollout_copy.ipynb")
    with open(root / "tools" / "layout_known.txt", "a") as f: f.write("train.grpo -> train.run\n")
    r = _check(root)
    assert r.returncode == 1
    assert "notebooks share the number 31" in r.stdout and "train.grpo -> train.run no longer occurs" in r.stdout, r.stdout


def _style(root):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "check_style.py"), "--root", str(root)], capture_output=True, text=True)


def test_style_passes_and_fails_on_a_long_line_or_a_semicolon(tmp_path):
    assert _style(ROOT).returncode == 0, _style(ROOT).stdout
    root = _copy(tmp_path)
    core = root / "scope_nb" / "core" / "dialogue.py"
    core.write_text(core.read_text() + "\n\nx = 1; y = 2\nz = '" + "a" * 130 + "'\n")
    r = _style(root)
    n = len(core.read_text().splitlines())
    assert r.returncode == 1 and f"dialogue.py:{n - 1}: ';' joins two statements" in r.stdout and f"dialogue.py:{n}: 136 characters" in r.stdout, r.stdout


def test_string_registry_and_entry_point_are_checked(tmp_path):
    "A string naming a higher-numbered module of the same package is a dependency too; an entry point must name a module that exists."
    root = _copy(tmp_path)
    envs = root / "scope_nb" / "envs" / "base.py"
    envs.write_text(envs.read_text() + '\n\nLATER = {"p4g": "scope_nb.envs.p4g:P4GEnv"}   # envs (10) naming p4g (11) by string\n')
    shutil.copy2(ROOT / "pyproject.toml", root / "pyproject.toml")
    with open(root / "pyproject.toml", "a") as f: f.write('\n[project.entry-points."scope_nb.extra"]\nx = "scope_nb.nowhere:X"\n')
    r = _check(root)
    assert r.returncode == 1 and "scope_nb/envs/base.py" in r.stdout and "imports envs.p4g (nbs/envs/11_p4g.ipynb): inside a package" in r.stdout, r.stdout
    assert "entry point scope_nb.extra.x = 'scope_nb.nowhere:X': no notebook exports scope_nb.nowhere" in r.stdout, r.stdout


def test_style_fails_on_a_module_over_600_lines(tmp_path):
    root = _copy(tmp_path)
    (root / "scope_nb" / "big.py").write_text("x = 1\n" * 601)
    r = _style(root)
    assert r.returncode == 1 and "big.py: 601 lines (at most 600); split its notebook" in r.stdout, r.stdout
