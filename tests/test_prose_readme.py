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


NUMBER_WORDS = {14: "fourteen", 15: "fifteen", 16: "sixteen", 17: "seventeen", 18: "eighteen", 19: "nineteen",
                20: "twenty", 21: "twenty-one", 22: "twenty-two"}


def test_readme_counts_the_exercises_and_their_parts():
    from moe_tutorial.exercises.catalog import EXERCISES

    parts = sorted({ex.part for ex in EXERCISES.values()})
    text = " ".join(README.read_text().split())
    assert f"({NUMBER_WORDS[len(EXERCISES)]} exercises, from the router to Part 7's scaled K loop)" in text
    assert parts == [1, 2, 3, 4, 7] and "for each of Parts 1 to 4 and 7" in text, parts
    first, last = EXERCISES[next(iter(EXERCISES))], EXERCISES[list(EXERCISES)[-1]]
    assert first.function == "route" and last.title == "The scaled K loop"


def test_readme_lists_every_part():
    from reading import lessons

    text = README.read_text()
    for notebook in lessons():
        assert f"| `{notebook}` |" in text, notebook
    assert f"(01 loop ... {lessons()[-1][:2]} " in text


def test_readme_fp8_sentence_is_the_data():
    from moe_tutorial.figures import part7

    rows = results.load_rows(results.DATA_DIR / "h200_fp8_bench.csv")
    models = report.model_order(results.select(rows, impl="fp8"))
    sp = {}
    for model in models:
        m, s = part7.speedups(rows, model, "first")
        sp.update({(model, int(M)): float(v) for M, v in zip(m, s)})
    mid = [v for (_, M), v in sp.items() if 8 <= M <= 256]
    at1 = {mo: v for (mo, M), v in sp.items() if M == 1}
    slower = [mo for (mo, M), v in sp.items() if M == 16384 and v < 1]
    words = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}
    text = " ".join(README.read_text().split())
    sentence = (f"From M = 8 to 256 the FP8 gate/up GEMM is {min(mid):.2f}x to {max(mid):.2f}x as fast as the bf16 one "
                f"(at M = 1, {min(at1.values()):.2f}x on {min(at1, key=at1.get)} to {max(at1.values()):.2f}x on "
                f"{max(at1, key=at1.get)}); at M >= 4096 it reaches under half of the FP8 matmul rate, and at "
                f"M = 16384 it is slower than bf16 on {words[len(slower)]} of the {words[len(models)]} models")
    assert sentence in text, sentence


def test_readme_part8_table_is_the_data():
    from moe_tutorial.experiments import backward

    table = backward.summary_table(backward.load_backward(), markdown=True)
    assert table in README.read_text(), ("README.md's Part 8 table is stale; paste this one:\n" + table)
