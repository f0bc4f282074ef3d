"""What a shipped study's search and its day-1 switch cost (prints numbers; asserts nothing about speed).

Run: ``.venv/bin/python benchmarks/bench_study_search.py [overlay ...]`` (default: the five shipped studies).
For each: ``launch.artifacts.plan_search`` (the search as launched, what the analytic stage runs), the
runner-up (``search.layouts.runner_up_row``) and the preflight's fallback at a measured ×1.19 memory error
(``launch.preflight.preflight_fallback``, which names check 2's second layout when its switch is the runner-up).
The runner-up and check 2's filter are also timed against their row-by-row forms (a ``Layout`` per candidate,
as before they were vectorised), with the ratio; and ``search.layouts.tie_order`` on the study's feasible rows (what
every ranking runs, ~3 per ``plan_search``) against its earlier form (a fresh index array per step).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from trainplan.config import load_config
from trainplan.launch.artifacts import launch_judge, plan_search
from trainplan.launch.preflight import preflight_fallback
from trainplan.model.layout import Layout
from trainplan.search.layouts import (
    HEADROOM_TIE,
    TIE_FRAC,
    launched_tps,
    runner_up_index,
    runner_up_row,
    shards_alike,
    shards_alike_mask,
    tie_order,
)

CONFIG = Path(__file__).resolve().parents[1] / "config"
STUDIES = ["config.yaml", "lora.yaml", "qlora.yaml", "seq8k.yaml", "fp8.yaml"]


def _timed(fn, *a, **k):
    t0 = time.perf_counter()
    out = fn(*a, **k)
    return out, time.perf_counter() - t0


def _runner_up_rowwise(feas):
    """The runner-up by a Layout per row (the form runner_up_row replaced): the reference for its ratio."""
    feas = feas.sort_values("rank", kind="stable")
    chosen = Layout.from_row(feas.iloc[0])
    seen, others = {chosen.family}, []
    for _, r in feas.iterrows():
        lay = Layout.from_row(r)
        if lay.family not in seen:
            seen.add(lay.family)
            others.append((lay, r))
    pick = runner_up_index(chosen, launched_tps(feas.iloc[0]), [(lay, launched_tps(r)) for lay, r in others])[0]
    return None if pick is None else others[pick][1]


def _alike_rowwise(feas, b: Layout) -> list[bool]:
    """shards_alike by a Layout per row (check 2's filter before shards_alike_mask): the reference for its ratio."""
    return [shards_alike(Layout.from_row(r), b) for _, r in feas.iterrows()]


def _tie_order_stepwise(tput, headroom, complexity):
    """tie_order as it was (the untaken rows of the band gathered into an index array at every step): the
    reference for its ratio."""
    n = len(tput)
    taken, neg, order, start = np.zeros(n, dtype=bool), -np.asarray(tput, dtype=float), np.empty(n, dtype=int), 0
    for k in range(n):
        while taken[start]:
            start += 1
        end = int(np.searchsorted(neg, -(1.0 - TIE_FRAC) * tput[start], side="right"))
        w = np.arange(start, end)[~taken[start:end]]
        w = w[headroom[w] >= headroom[w].max() - HEADROOM_TIE]
        j = int(w[complexity[w] == complexity[w].min()][0])
        order[k], taken[j] = j, True
    return order


def main(overlays: list[str]) -> None:
    print(f"{'study':<12} {'rows':>7} {'feasible':>8} {'plan_search':>11} {'runner-up':>10} {'row-wise':>9} "
          f"{'ratio':>6} {'alike mask':>10} {'row-wise':>9} {'ratio':>6} {'preflight x1.19':>15} {'tie_order':>9} "
          f"{'per-step':>9} {'ratio':>6}")
    for ov in overlays:
        cfg = load_config([CONFIG / "config.yaml", CONFIG / ov])
        m, c, t, eff = cfg.model, cfg.cluster, cfg.training, cfg.efficiency
        df, t_search = _timed(plan_search, m, c, t, eff)
        ok = df[df["feasible"]]
        ru, t_ru = _timed(runner_up_row, ok)
        ru_ref, t_ru_ref = _timed(_runner_up_rowwise, ok)
        assert (ru is None) == (ru_ref is None) and (ru is None or ru["layout_text"] == ru_ref["layout_text"])
        sw = Layout.from_row(ok.iloc[1])
        mask, t_mask = _timed(shards_alike_mask, ok, sw)
        ref, t_ref = _timed(_alike_rowwise, ok, sw)
        assert list(mask) == ref
        r = ok.assign(_s=launched_tps(ok)).sort_values(["_s", "headroom_frac", "complexity"],
                                                       ascending=[False, False, True], kind="stable")
        arrays = (r["_s"].to_numpy(), r["headroom_frac"].to_numpy(), r["complexity"].to_numpy())
        order, t_tie = _timed(tie_order, *arrays)
        order_ref, t_tie_ref = _timed(_tie_order_stepwise, *arrays)
        assert (order == order_ref).all()
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "candidates.csv"
            ok.to_csv(path, index=False)
            judge = launch_judge(m, c, t, eff)
            _, t_pre = _timed(preflight_fallback, path, mem_ratio=1.19, judge=judge)
        print(f"{ov.removesuffix('.yaml'):<12} {len(df):>7,} {len(ok):>8,} {t_search:>10.2f}s {t_ru * 1e3:>8.0f}ms "
              f"{t_ru_ref:>8.2f}s {t_ru_ref / t_ru:>5.0f}x {t_mask * 1e3:>8.1f}ms {t_ref:>8.2f}s {t_ref / t_mask:>5.0f}x "
              f"{t_pre:>14.2f}s {t_tie:>8.2f}s {t_tie_ref:>8.2f}s {t_tie_ref / t_tie:>5.1f}x")


if __name__ == "__main__":
    main(sys.argv[1:] or STUDIES)
