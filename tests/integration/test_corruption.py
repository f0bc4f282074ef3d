"""Corrupted results are never used (issue 13, item 4).

A proxy RECORD that is missing, cut in half, ``{}``, of the wrong type or off the schema fails ``aggregate``
with its path named and is removed (with its sidecar), so the next run redoes exactly that proxy. A results
CSV that no longer matches its provenance sidecar (records.csv cut at a row boundary) fails the stage that
reads it, with its path and the row count it was promised, and is removed so its rule reruns.
The records here are built by ``proxy.record.assemble_record`` (what the launcher writes), without torch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from trainplan.config import config_slice, load_config
from trainplan.io import write_json
from trainplan.provenance import read_sidecar, sidecar_path, write_sidecar
from trainplan.proxy.aggregate import RecordsError, check_record
from trainplan.proxy.record import assemble_record
from trainplan.proxy.schema import normalize_run_spec
from trainplan.stages import aggregate, common, fit_scaling

IDS = ["depth-L1", "depth-L2", "width-h64"]
ROOT = Path(__file__).resolve().parents[2]
TINY = [ROOT / "config" / "config.yaml", ROOT / "config" / "tiny.yaml"]


def _spec(i: str) -> dict:
    layers = int(i[-1]) if i.startswith("depth") else 2
    return normalize_run_spec({"id": i, "model": {"preset": "debug", "layers": layers}, "layout": {"dp": 2},
                               "seq_len": 64, "global_batch": 4, "steps": 3, "warmup": 1, "nproc_per_node": 2})


def _record(spec: dict) -> dict:
    from trainplan.model.arch import ModelSpec
    from trainplan.model.layout import Layout
    from trainplan.proxy import analytic

    exact = analytic.exact_state_bytes(ModelSpec.from_dict(spec["model"]), Layout.from_dict(spec["layout"]))
    ranks = [{"rank": r, "status": "ok", "state": exact, "exact_state": exact, "footprint_bytes": 0,
              "saved": {"mean_layer_bytes": 1000.0, "complete": True}, "loss": [5.5, 5.4, 5.3],
              "environment": {"world_size": 2, "backend": "gloo", "hostname": "h"}} for r in range(2)]
    return assemble_record(spec, ranks, timed_out=False, returncode=0, wall_s=1.0)


@pytest.fixture
def study(tmp_path: Path) -> Path:
    """results/proxies: proxy_set.json and one RECORD (+ sidecar) per id, as the workflow leaves them."""
    res = tmp_path / "results" / "proxies"
    specs = [_spec(i) for i in IDS]
    write_json(res / "proxy_set.json", {"status": "ok", "proxies": specs})
    for s in specs:
        out = res / "runs" / f"{s['id']}.json"
        write_json(out, _record(s))
        write_sidecar(out, rule="proxy_run", config_slice={"spec": s["id"]}, inputs=[res / "proxy_set.json"])
    return res


def _runs(res: Path) -> list[str]:
    return [str(res / "runs" / f"{i}.json") for i in IDS]


def _aggregate(res: Path) -> None:
    aggregate.run({"records": _runs(res)}, {"records": str(res / "records.csv")}, {})


def test_aggregate_writes_one_row_per_promised_run_and_promises_the_count(study):
    _aggregate(study)
    df = pd.read_csv(study / "records.csv")
    assert list(df["id"]) == IDS
    extra = read_sidecar(study / "records.csv")["extra"]
    assert extra["rows"] == 3 and extra["ids"] == IDS
    common.verify_result(study / "records.csv")  # intact: passes


def _cut_half(p: Path) -> None:
    t = p.read_text()
    p.write_text(t[: len(t) // 2])


def _wrong_type(p: Path) -> None:
    rec = json.loads(p.read_text())
    rec["status"] = 5
    p.write_text(json.dumps(rec))


def _no_memory(p: Path) -> None:
    rec = json.loads(p.read_text())
    del rec["memory"]
    p.write_text(json.dumps(rec))


def _other_run(p: Path) -> None:
    rec = json.loads(p.read_text())
    rec["id"] = "someone-else"
    p.write_text(json.dumps(rec))


CORRUPTIONS = {
    "cut in half": (_cut_half, "not valid JSON"),
    "{}": (lambda p: p.write_text("{}"), "not a valid RECORD"),
    "a list": (lambda p: p.write_text("[]"), "a JSON list, not a RECORD object"),
    "empty file": (lambda p: p.write_text(""), "not valid JSON"),
    "status of the wrong type": (_wrong_type, "not a valid RECORD"),
    "required key gone": (_no_memory, "'memory' is a required property"),
    "another run's record": (_other_run, "holds the record of run 'someone-else'"),
    "missing": (lambda p: p.unlink(), "missing"),
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_a_bad_record_fails_aggregate_by_name_and_is_removed_with_its_sidecar(study, kind):
    corrupt, why = CORRUPTIONS[kind]
    bad = study / "runs" / "depth-L2.json"
    corrupt(bad)
    with pytest.raises(common.CorruptResultError) as e:
        _aggregate(study)
    msg = str(e.value)
    assert f"{bad}: " in msg and why in msg, msg
    assert "rerun snakemake" in msg
    assert not bad.exists() and not sidecar_path(bad).exists()  # so Snakemake reruns exactly this proxy
    for i in ("depth-L1", "width-h64"):  # the good ones stay
        assert (study / "runs" / f"{i}.json").exists() and sidecar_path(study / "runs" / f"{i}.json").exists()
    assert not (study / "records.csv").exists()


def test_every_bad_record_is_named_at_once(study):
    _cut_half(study / "runs" / "depth-L1.json")
    (study / "runs" / "width-h64.json").write_text("{}")
    with pytest.raises(common.CorruptResultError) as e:
        _aggregate(study)
    assert "2 proxy record(s)" in str(e.value)
    assert "depth-L1.json" in str(e.value) and "width-h64.json" in str(e.value)


def test_a_run_of_proxy_set_without_a_record_is_named(study):
    with pytest.raises(common.CorruptResultError, match=r"width-h64.json: missing \(named in proxy_set.json\)"):
        aggregate.run({"records": _runs(study)[:2]}, {"records": str(study / "records.csv")}, {})


def test_check_record_names_the_file_instead_of_a_bare_traceback(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"schema_version": 1, "id": "x", "sta')
    with pytest.raises(RecordsError) as e:
        check_record(p)
    assert e.value.paths == [p] and str(p) in str(e.value) and "truncated" in str(e.value)


# ---------------------------------------------------------------------- records.csv and later stages
def _cut_rows(path: Path, keep: int) -> None:
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[: keep + 1]))  # header + keep rows: cut at a row boundary


def test_records_csv_cut_at_a_row_boundary_fails_the_next_stage_with_the_count(study):
    _aggregate(study)
    csv = study / "records.csv"
    _cut_rows(csv, 1)
    assert len(pd.read_csv(csv)) == 1  # a perfectly readable table: only the promise shows the cut
    with pytest.raises(common.CorruptResultError) as e:
        fit_scaling.run({"records": str(csv)}, {"scaling": str(study / "scaling.json")},
                               config_slice(load_config(TINY).raw, "fit_scaling"))
    msg = str(e.value)
    assert f"{csv}: 1 rows but aggregate wrote 3" in msg, msg
    assert not csv.exists() and not sidecar_path(csv).exists()  # so aggregate reruns
    assert not (study / "scaling.json").exists()


def test_every_stage_checks_its_inputs_before_it_runs(study):
    """``stages.common.stage`` (every Snakemake rule) runs ``verify_inputs``: a cut file fails with its name."""
    _aggregate(study)
    csv = study / "records.csv"
    csv.write_text(csv.read_text().replace("depth-L1", "depth-L9"))  # same rows, edited content
    with pytest.raises(common.CorruptResultError, match="content differs from what it wrote"):
        common.verify_inputs({"records": str(csv), "published": [str(study / "proxy_set.json")]})
    assert not csv.exists()


def test_an_unreadable_sidecar_takes_its_file_with_it(study):
    _aggregate(study)
    csv = study / "records.csv"
    sidecar_path(csv).write_text('{"output": ')
    with pytest.raises(common.CorruptResultError, match="provenance sidecar .* is unreadable"):
        common.verify_result(csv)
    assert not csv.exists() and not sidecar_path(csv).exists()


def test_files_without_a_sidecar_are_not_judged(tmp_path):
    src = tmp_path / "published.csv"
    src.write_text("a,b\n1,2\n")
    common.verify_result(src)
    common.verify_result(tmp_path / "not-there.csv")
    assert src.exists()


def test_a_cut_json_result_is_named_as_such(study):
    bad = study / "runs" / "depth-L1.json"
    _cut_half(bad)
    with pytest.raises(common.CorruptResultError, match=r"depth-L1.json: not valid JSON \(.* characters\)"):
        common.verify_inputs({"records": _runs(study)})
    assert not bad.exists() and not sidecar_path(bad).exists()


class _Smk:
    """The parts of Snakemake's ``snakemake`` object a stage reads."""

    def __init__(self, inp: dict, out: dict):
        self.input, self.output, self.params, self.wildcards = inp, out, {"cfg": {}}, {}
        self.log, self.rule, self.attempt = [], "aggregate", 1


def test_the_snakemake_entry_point_verifies_inputs_before_the_stage_runs(study):
    _aggregate(study)
    runs = _runs(study)
    (Path(runs[2])).write_text(Path(runs[2]).read_text().replace('"ok"', '"oom"', 1))  # valid JSON, edited
    with pytest.raises(common.CorruptResultError, match="width-h64.json: its content differs"):
        aggregate.main(_Smk({"records": runs}, {"records": str(study / "records2.csv")}))
    assert not Path(runs[2]).exists() and not (study / "records2.csv").exists()


def test_read_table_parses_a_late_text_column_without_a_mixed_type_warning(tmp_path):
    """candidates.csv's ``reason`` is empty for the feasible layouts (most rows, first) and text for the rest; pandas'
    chunked parse warns of mixed types there (the default study printed that DtypeWarning from two stages).
    ``read_table`` parses whole: no warning, and the column is text."""
    import warnings

    n, first_text = 54_288, 24_092  # the shape that warned: the default study's candidates.csv with eager async-TP rows
    p = tmp_path / "candidates.csv"
    cols = {f"c{i}": [0.123456] * n for i in range(45)}
    pd.DataFrame({**cols, "reason": [""] * first_text + ["OOM: needs 90 GiB"] * (n - first_text)}).to_csv(p, index=False)
    with pytest.warns(pd.errors.DtypeWarning):
        pd.read_csv(p)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        df = common.read_table(p)
    assert len(df) == n and df["reason"].iloc[-1] == "OOM: needs 90 GiB"
