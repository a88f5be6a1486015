"""The README's H200 table is the committed data, rendered by the same code as notebook 05's."""
from pathlib import Path

from moe_tutorial.perf import registry, report, results

README = Path(__file__).resolve().parents[1] / "README.md"
#: The README's rows, in order.
README_IMPLS = ("loop", "indexing", "published", "fused", "minimal", "+router-epilogue", "sorted",
                "sorted-heuristic", "grouped_mm")


def readme_table() -> str:
    rows = results.load_rows(results.H200_RESULTS)
    return report.summary_table(rows, README_IMPLS, labels=registry.LABELS, protocol="cold-l2", markdown=True)


def test_readme_table_is_the_data():
    table = readme_table()
    assert table in README.read_text(), ("README.md's H200 table is stale; paste this one:\n" + table)


def test_readme_names_the_datas_date_and_protocol():
    rows = [r for r in results.load_rows(results.H200_RESULTS) if r["protocol"] == "cold-l2"]
    dates = sorted({r["date"][:10] for r in rows})
    text = " ".join(README.read_text().split())
    assert f"measured {dates[-1]} with torch {rows[0]['torch'][:4]} and Triton {rows[0]['triton'][:3]}" in text
    assert "cold-l2 protocol" in text


def test_readme_fp8_table_is_the_data():
    rows = results.load_rows(results.DATA_DIR / "h200_fp8_bench.csv")
    table = report.summary_table(rows, ("sorted", "fp8"), labels=registry.LABELS, protocol="cold-l2", markdown=True)
    assert table in README.read_text(), ("README.md's FP8 table is stale; paste this one:\n" + table)


def test_readme_part8_table_is_the_data():
    from moe_tutorial.experiments import backward

    table = backward.summary_table(backward.load_backward(), markdown=True)
    assert table in README.read_text(), ("README.md's Part 8 table is stale; paste this one:\n" + table)
