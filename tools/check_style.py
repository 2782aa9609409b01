"""Library style check: one statement per line (no `;`), no line over 120 characters and no module over 600 lines
in `scope_nb/`.

    python tools/check_style.py [--root .]

Exempt: the generated `_modidx.py`, and the first line of nbdev's generated `__all__` (nbdev wraps the list at 120
characters, then puts `__all__ = ` in front of it). Exit 1 with one `path:line: problem` per violation; fix them in
the notebooks and export again."""
import argparse, io, sys, tokenize
from pathlib import Path

LIMIT = 120
MODULE_LINES = 600  # past this a module holds more than one idea: split its notebook


def problems(py: Path) -> list[str]:
    out, text = [], py.read_text()
    n = len(text.splitlines())
    if n > MODULE_LINES: out.append(f"{py}: {n} lines (at most {MODULE_LINES}); split its notebook")
    for i, line in enumerate(text.splitlines(), 1):
        if len(line) > LIMIT and not line.startswith("__all__ = ["):
            out.append(f"{py}:{i}: {len(line)} characters (at most {LIMIT})")
    for t in tokenize.generate_tokens(io.StringIO(text).readline):
        if t.type == tokenize.OP and t.string == ";": out.append(f"{py}:{t.start[0]}: ';' joins two statements")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=".")
    root = Path(ap.parse_args(argv).root)
    files = sorted(p for p in (root / "scope_nb").rglob("*.py") if p.name != "_modidx.py")
    bad = [p for f in files for p in problems(f)]
    for b in bad: print(b)
    ok = f"one statement per line, lines <= {LIMIT} characters, modules <= {MODULE_LINES} lines"
    print(f"style check: {len(files)} modules, " + (f"{len(bad)} problems" if bad else ok))
    return 1 if bad else 0


if __name__ == "__main__": sys.exit(main())
