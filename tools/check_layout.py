"""Layout check: what may import what, between the subpackages and between the notebooks of one subpackage.

    python tools/check_layout.py [--root .]

The library is split into subpackages whose order is the architecture (`PACKAGES`): a module may import modules of
the packages its own package lists, and, inside its own package, only modules exported by lower-numbered notebooks.
Each `nbs/<package>/NN_*.ipynb` names the module it exports (`#| default_exp`); every `import` of a `scope_nb` module
in the library, lazy imports inside functions included, and every string naming one (a registry entry such as
"scope_nb.envs.p4g:P4GEnv", imported later by name) counts; entry points the package declares in pyproject.toml must
name modules that exist. Two notebooks may not share a number, and a notebook's folder must be its module's package.
Exit 1 with one line per violation.

`tools/layout_known.txt` lists the forward imports inside a package still being untangled, one `importer -> imported`
per line; the check fails on any forward import not listed there, and on a listed one that no longer occurs (delete
its line), so the list can only shrink. A forbidden import between packages cannot be listed: move the code."""
import argparse, ast, json, re, sys
from pathlib import Path


# package -> the packages its modules may import (besides its own); the order is the architecture, bottom to top
PACKAGES = {
    "core": (),
    "diagnostics": ("core",),
    "users": ("core",),
    "envs": ("core", "diagnostics", "users"),
    "train": ("core", "diagnostics", "users", "envs"),
    "experiments": ("core", "diagnostics", "users", "envs", "train"),
    "interop": ("core", "diagnostics", "users", "envs", "train"),
    "scale": ("core", "diagnostics", "users", "envs", "train", "experiments"),
    "study": ("core", "users", "envs", "experiments"),
    "cli": ("core", "diagnostics", "users", "envs", "train", "experiments", "interop", "scale", "study"),
}


def notebooks(nbs: Path) -> list[Path]:
    "Every numbered notebook, in any folder under `nbs`."
    return sorted(p for p in nbs.rglob("[0-9][0-9]_*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def notebook_modules(nbs: Path) -> dict[str, tuple[int, str]]:
    "module -> (lowest notebook number exporting it, notebook path relative to `nbs`)."
    out = {}
    for p in notebooks(nbs):
        src = "\n".join("".join(c["source"]) for c in json.loads(p.read_text())["cells"] if c["cell_type"] == "code")
        for m in re.findall(r"^#\|\s*default_exp\s+(\S+)", src, re.M):
            num = int(p.name[:2])
            if m not in out or num < out[m][0]: out[m] = (num, str(p.relative_to(nbs)))
    return out


def package_of(module: str) -> str:
    "The subpackage a module belongs to ('' for a module at the top of scope_nb)."
    return module.split(".")[0] if "." in module else ""


def imports_of(py: Path, package: str, known) -> list[tuple[int, str]]:
    "(line, module) of every scope_nb module that `py` (in subpackage `package`, '' for the top) imports; names as `known` spells them."
    out = []
    def add(line, dotted):  # the longest known module that `dotted` (relative to scope_nb) starts with
        parts = dotted.split(".")
        for k in range(len(parts), 0, -1):
            if ".".join(parts[:k]) in known: out.append((line, ".".join(parts[:k]))); return
    for node in ast.walk(ast.parse(py.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1] if package else []
                base = [b for b in base if b]
                prefix = ".".join(base + ([node.module] if node.module else []))
                for a in node.names: add(node.lineno, f"{prefix}.{a.name}" if prefix else a.name)
            elif node.module and node.module.startswith("scope_nb."):
                for a in node.names: add(node.lineno, f"{node.module[9:]}.{a.name}")
            elif node.module == "scope_nb":
                for a in node.names: add(node.lineno, a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("scope_nb."): add(node.lineno, a.name[9:])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):  # a string registry: "scope_nb.mod:Name"
            m = re.fullmatch(r"scope_nb\.([A-Za-z_][\w.]*)(:[\w.]+)?", node.value)
            if m: add(node.lineno, m.group(1))
    return out


def known_forward(root: Path) -> set[tuple[str, str]]:
    "The listed `importer -> imported` pairs of `tools/layout_known.txt` (comments after #)."
    p = root / "tools" / "layout_known.txt"
    lines = [l.split("#")[0].strip() for l in p.read_text().splitlines()] if p.exists() else []
    return {tuple(x.strip() for x in l.split("->")) for l in lines if l}


def check(root: Path) -> list[str]:
    nbs, lib = root / "nbs", root / "scope_nb"
    mods, problems, known, seen = notebook_modules(nbs), [], known_forward(root), set()
    nums = {}
    for p in notebooks(nbs): nums.setdefault(p.name[:2], []).append(str(p.relative_to(nbs)))
    problems += [f"notebooks share the number {n}: {', '.join(v)}" for n, v in nums.items() if len(v) > 1]
    for m, (_, nb) in sorted(mods.items()):
        pkg, folder = package_of(m), str(Path(nb).parent)
        if pkg not in PACKAGES:
            problems.append(f"nbs/{nb} exports {m}: every module lives in one of the packages {', '.join(PACKAGES)} "
                            f"(or add its package to PACKAGES in tools/check_layout.py)")
        elif folder != pkg:
            problems.append(f"nbs/{nb} exports {m}: move the notebook to nbs/{pkg}/")
    for py in sorted(lib.rglob("*.py")):
        rel = py.relative_to(lib).with_suffix("")
        me = ".".join(rel.parts)
        if me not in mods: continue
        num, nb = mods[me]
        mine = package_of(me)
        for line, m in imports_of(py, ".".join(rel.parts[:-1]), mods):
            if m == me: continue
            theirs = package_of(m)
            if theirs != mine and theirs not in PACKAGES.get(mine, ()):
                may = ", ".join(PACKAGES.get(mine, ())) or "no other package"
                problems.append(f"scope_nb/{rel}.py:{line} (nbs/{nb}) imports {m} (nbs/{mods[m][1]}): package {mine} may "
                                f"import {may}; move the code to where it belongs")
            elif theirs == mine and mods[m][0] >= num:
                seen.add((me, m))
                if (me, m) not in known:
                    problems.append(f"scope_nb/{rel}.py:{line} (nbs/{nb}) imports {m} (nbs/{mods[m][1]}): inside a package "
                                    f"a notebook may only import lower-numbered ones; move the code or renumber the notebooks")
    problems += [f"tools/layout_known.txt: {a} -> {b} no longer occurs; delete that line" for a, b in sorted(known - seen)]
    pyproject = root / "pyproject.toml"
    if pyproject.exists():
        import tomllib
        groups = tomllib.loads(pyproject.read_text()).get("project", {}).get("entry-points", {})
        for group, eps in groups.items():
            for name, target in eps.items():
                mod = target.split(":")[0]
                if mod.startswith("scope_nb.") and not mod.startswith("scope_nb._") and mod[9:] not in mods:
                    problems.append(f"pyproject.toml: entry point {group}.{name} = {target!r}: no notebook exports {mod}")
    return problems


if __name__ == "__main__":
    ap = argparse.ArgumentParser(); ap.add_argument("--root", default=".")
    probs = check(Path(ap.parse_args().root))
    for p in probs: print(p)
    n = len(known_forward(Path(ap.parse_args().root)))
    print(f"layout check: {len(probs)} problem(s)" if probs else
          f"layout check: {len(PACKAGES)} packages, every import allowed ({n} forward import(s) listed in tools/layout_known.txt)")
    sys.exit(1 if probs else 0)
