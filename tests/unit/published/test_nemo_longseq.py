"""NeMo's long-sequence Llama 2 7B FP8 table (4K–1M tokens, CP up to 32; data/nemo_long_sequence_llama2_7b_H100_fp8.csv,
SOURCES.md): scored in NeMo's own model-FLOPs count, never fitted on."""

import pytest

from trainplan.model import flops
from trainplan.model.arch import resolve_model
from trainplan.published.fit import GEN_FIT, never_fitted_rows
from trainplan.published.tables import NEMO_MODELS, NEVER_FITTED, load_table, validate_all

# Reached with the shipped H100 fit: MAPE 14.7% (17.6% while TE's runs were charged torchao's casts). The 4K row,
# where the GEMMs dominate, is within 3% (TE's fused casts, timing.te_fp8_cast_bytes); from 32K on every row is
# under-predicted by 12–23%, growing with the attention's share: TE's attention beats the fitted PyTorch-SDPA rate.
NEMO_LONGSEQ_MAPE_TOL_PCT = 15.5


def test_nemo_flops_formula_reproduces_nemo_2407_model_tflops():
    """The formula is NeMo's, not a guess: model TFLOP/s ÷ tokens/s of every Llama pre-training row of NeMo 24.07
    equals it to 0.1%. It is our convention too (attention counted full); a causal count (half the attention term)
    would miss the published column by 3.6–7%, so the check can fail."""
    n = load_table("nemo_24.07_H100_fp8.csv")
    n = n[(n["task"] == "pretrain") & n["model"].isin(list(NEMO_MODELS))]
    assert len(n) == 5
    for r in n.itertuples():
        m = resolve_model(NEMO_MODELS[r.model])
        per_token = r.model_tflops_per_gpu * 1e12 / r.tokens_per_s_per_gpu
        assert flops.nemo_llama_model_flops_per_token(m, int(r.seq_len)) == pytest.approx(per_token, rel=1e-3), r.model
        ours = flops.model_flops_per_token(m, int(r.seq_len))
        assert ours == pytest.approx(per_token, rel=1e-3)
        causal = ours - 6.0 * m.layers * m.heads * m.head_dim * int(r.seq_len)
        assert abs(causal / per_token - 1.0) > 0.03  # 70B: 3.6%, 7B: 7%


def test_every_row_is_scored_with_its_published_layout_and_never_fitted():
    rows = validate_all(tables=("nemo_longseq_h100",))
    raw = load_table("nemo_long_sequence_llama2_7b_H100_fp8.csv")
    assert len(rows) == len(raw) == 9 and rows["in_mape"].all()
    assert "nemo_longseq_h100" in NEVER_FITTED and "nemo_longseq_h100" not in GEN_FIT["h100"]["tables"]
    last = rows.iloc[-1]
    assert last["seq_len"] == 1024 * 1024 and last["n_gpus"] == 1024
    assert "dp4·tp8(sp)·pp1·cp32(ring)" in last["layout"]
    assert set(rows["family"]) == {"FSDP/ZeRO", "PP", "TP", "CP"}


def test_nemo_longseq_held_out_mape():
    rows = never_fitted_rows()
    assert set(rows["table"]) == set(NEVER_FITTED)
    e = rows.loc[rows["table"] == "nemo_longseq_h100", "err_pct"]
    assert e.abs().mean() <= NEMO_LONGSEQ_MAPE_TOL_PCT, e.to_list()
