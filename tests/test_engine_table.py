"""docs/verl.md's estimator x engine table is the registry's (``gear_rl.integrations.engines``):
regenerate it with ``python -m gear_rl.integrations.engines --write`` when an estimator or an
engine's support changes."""

from __future__ import annotations

import pytest

from gear_rl.credit import estimator_names, get_estimator
from gear_rl.integrations import engines


def test_docs_hold_the_table_as_the_registry_gives_it() -> None:
    text = engines.DOC.read_text()
    table = text.split(engines.BEGIN, 1)[1].split(engines.END, 1)[0]
    assert table.strip() == engines.engine_table().strip(), (
        "docs/verl.md's engine table is stale: python -m gear_rl.integrations.engines --write")


def test_every_estimator_has_a_row_saying_why_an_engine_refuses_it() -> None:
    lines = engines.engine_table().splitlines()[2:]
    rows = {line.split("|")[1].strip(" `"): line for line in lines}
    assert set(rows) == set(estimator_names())
    for name, line in rows.items():
        for engine in engines.ENGINES:
            why = get_estimator(name).engine_limit(engine)
            assert ("no: " + why in line) if why else line.count("yes") >= 1
    assert rows["gigpo"].split("|")[4].strip() == "yes"  # verl runs step-level credit
    assert rows["gigpo"].split("|")[5].strip().startswith("no: step-level")  # TRL does not


def test_rewrite_puts_the_table_between_the_markers(tmp_path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(f"head\n{engines.BEGIN}\nold\n{engines.END}\ntail\n")
    assert engines.rewrite(doc) is True and engines.rewrite(doc) is False
    table = engines.engine_table()
    assert doc.read_text() == f"head\n{engines.BEGIN}\n{table}{engines.END}\ntail\n"
    bare = tmp_path / "bare.md"
    bare.write_text("no markers")
    with pytest.raises(ValueError, match="no engine-table markers"):
        engines.rewrite(bare)
