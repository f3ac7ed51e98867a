"""docs/verl.md lists exactly the registry's tables (hybridrl/compat/verl/keys.py)."""

from pathlib import Path

from hybridrl.compat.verl.keys import markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "verl.md"


def test_the_tables_in_docs_verl_md_are_the_registrys():
    text = DOC.read_text()
    marker = "tests/verl/test_verl_docs.py checks it. -->\n\n"
    assert text.split(marker, 1)[1] == markdown(), "regenerate the tables at the end of docs/verl.md"
