"""Check that the notebooks and the exported library agree, and that the notebooks are clean.

Works on a copy of the project, so it never touches the working tree and needs no git state:
`nbdev-export` and `nbdev-clean` run in the copy and any file they change is a failure.

    python tools/check_sync.py [ROOT]        # exit 1 and name the files if out of sync
"""
from __future__ import annotations
import filecmp, shutil, subprocess, sys, tempfile
from pathlib import Path

IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")


def _tool(name: str) -> str:
    "The nbdev command next to this interpreter (the project's venv), else from PATH."
    p = Path(sys.executable).parent / name
    return str(p) if p.exists() else name


def _diff(a: Path, b: Path, rel: Path = Path()) -> list[str]:
    "Relative paths of files that differ, or exist on one side only, between folders `a` and `b`."
    c = filecmp.dircmp(a, b, ignore=["__pycache__", ".ipynb_checkpoints"])
    out = [str(rel / n) for n in c.left_only + c.right_only + c.funny_files]
    out += [str(rel / n) for n in c.common_files if not filecmp.cmp(a / n, b / n, shallow=False)]
    for d in c.common_dirs: out += _diff(a / d, b / d, rel / d)
    return sorted(out)


def check_sync(root: str | Path = ".") -> list[str]:
    "Problems found (empty list = in sync): library files that `nbdev-export` would change, notebooks `nbdev-clean` would change."
    root = Path(root).resolve()
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / root.name
        work.mkdir()
        shutil.copy2(root / "pyproject.toml", work / "pyproject.toml")
        for d in ("nbs", "scope_nb"): shutil.copytree(root / d, work / d, ignore=IGNORE)
        for cmd, folder, fix in (("nbdev-export", "scope_nb", "run `nbdev-export` and commit scope_nb/"),
                                 ("nbdev-clean", "nbs", "run `nbdev-clean` and commit nbs/")):
            r = subprocess.run([_tool(cmd)], cwd=work, capture_output=True, text=True)
            if r.returncode != 0:
                problems.append(f"{cmd} failed:\n{r.stdout}{r.stderr}")
                continue
            problems += [f"{folder}/{f}: out of date ({fix})" for f in _diff(root / folder, work / folder)]
    return problems


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    problems = check_sync(root)
    if problems:
        print("notebooks and library are out of sync:\n  " + "\n  ".join(problems), file=sys.stderr)
        sys.exit(1)
    n_nbs = len(list((root / "nbs").rglob("[0-9][0-9]_*.ipynb")))
    print(f"sync check: {n_nbs} notebooks clean and exported library up to date")
