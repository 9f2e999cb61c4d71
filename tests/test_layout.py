"""The package's shape, checked: modules stay small enough to hold one concern. (The import
rules, layers included, are import-linter's contracts in pyproject.toml, run by
scripts/lint.sh.)"""
from pathlib import Path

HVDLIKE = Path(__file__).resolve().parent.parent / "hvdlike"
MAX_LINES = 400


def test_no_module_of_the_package_is_longer_than_400_lines():
    lengths = {p.relative_to(HVDLIKE).as_posix(): len(p.read_text().splitlines())
               for p in HVDLIKE.rglob("*.py")}
    assert len(lengths) > 50, f"found only {sorted(lengths)} under {HVDLIKE}"
    over = {m: n for m, n in lengths.items() if n > MAX_LINES}
    assert over == {}, f"modules over {MAX_LINES} lines: {over}; split them by concern"
