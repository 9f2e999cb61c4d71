"""The package's shape, checked: modules stay small enough to hold one concern. (The import
rules, layers included, are import-linter's contracts in pyproject.toml, run by
scripts/lint.sh.)"""
from pathlib import Path

HVDLIKE = Path(__file__).resolve().parent.parent / "hvdlike"
MAX_LINES = 400
# modules that hold several concerns today, each at most as long as it is now, until split
# (docs/architecture.md, "Where the layers are not yet clean")
TOO_LONG = {
    "tensorflow/optimizer.py": 553,
    "tensorflow/parameter_server.py": 422,
}


def test_no_module_is_longer_than_400_lines_or_than_it_was_when_listed_as_too_long():
    lengths = {p.relative_to(HVDLIKE).as_posix(): len(p.read_text().splitlines())
               for p in HVDLIKE.rglob("*.py")}
    over = {m: n for m, n in lengths.items() if n > TOO_LONG.get(m, MAX_LINES)}
    assert over == {}, (f"modules over {MAX_LINES} lines (or over their listed length): {over}; "
                        "split them by concern")
    stale = {m: (TOO_LONG[m], lengths.get(m)) for m in TOO_LONG
             if lengths.get(m, 0) <= MAX_LINES}
    assert stale == {}, f"listed as too long but now short or gone, drop from TOO_LONG: {stale}"
