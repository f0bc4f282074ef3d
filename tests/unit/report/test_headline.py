"""The three lines snakemake prints when the study ends: from the results the memo reads, or nothing."""

import json
import shutil
from pathlib import Path

from trainplan.report.headline import headline

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "results_min"


def test_headline_reads_the_recommendation_and_cost_from_the_results(tmp_path):
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    assert headline(root) is None  # no memo built yet: the run made only part of the DAG
    (root / "memo").mkdir()
    (root / "memo" / "design_memo.pdf").write_bytes(b"%PDF-1.7")
    ch = json.loads((root / "prediction/production.json").read_text())["chosen"]
    usd = json.loads((root / "cost/cost.json").read_text())["dollars"]
    text = headline(root)
    assert text.splitlines()[0] == f"trainplan memo: {root / 'memo' / 'design_memo.pdf'}"
    assert f"{ch['family']}, {ch['layout']}: {ch['tokens_per_s_per_gpu_p50']:,.0f} tokens/s/GPU" in text
    assert f"(p10–p90 {ch['tokens_per_s_per_gpu_p10']:,.0f}–{ch['tokens_per_s_per_gpu_p90']:,.0f})" in text
    assert f"cost: ${usd['p50']:,.0f} (p10–p90 ${usd['p10']:,.0f}–${usd['p90']:,.0f})" in text


def test_headline_is_silent_on_missing_or_broken_inputs(tmp_path):
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    (root / "memo").mkdir()
    (root / "memo" / "design_memo.pdf").write_bytes(b"%PDF-1.7")
    (root / "cost/cost.json").write_text("{not json")
    assert headline(root) is None
    (root / "cost/cost.json").write_text(json.dumps({"dollars": {"p50": 1.0}}))  # no p10/p90
    assert headline(root) is None
    assert headline(tmp_path / "nowhere") is None
