"""Merge the per-rank results of one proxy run into the RECORD (schema: docs/proxy-record.md)."""

from __future__ import annotations

from typing import Any

from trainplan.model.arch import ModelSpec
from trainplan.model.layout import Layout
from trainplan.proxy import analytic
from trainplan.proxy.schema import validate_record

STATE_TERMS = ("weights", "gradients", "optimizer")


def predicted_state_terms(analytic_mem: dict[str, Any] | None) -> tuple[dict[str, float], str]:
    """The planner's per-rank weights/gradients/optimizer bytes that a proxy's *measured* state is compared with,
    and where they come from. The harness measures state between steps, so this is ``state_at_rest_bytes``
    (FSDP2's ZeRO-2 is sharded at rest like ZeRO-3: ``analytic.analytic_memory``) when the record has it, else
    the peak ``breakdown_bytes``. The proxy comparison (``aggregate``) and the preflight both use this one
    choice, so they agree for every sharding."""
    am = analytic_mem or {}
    rest = am.get("state_at_rest_bytes")
    if rest and all(rest.get(k) is not None for k in STATE_TERMS):
        return {k: float(rest[k]) for k in STATE_TERMS}, "memory.model_states at rest"
    bd = am.get("breakdown_bytes") or {}
    return {k: float(bd[k]) for k in STATE_TERMS if bd.get(k) is not None}, "memory_breakdown"


def _status(ranks: list[dict], timed_out: bool, returncode: int, host_oom_kills: int = 0,
            world: int | None = None) -> tuple[str, str]:
    by = {r.get("status") for r in ranks}
    msgs = "; ".join(f"rank {r.get('rank')}: {r['message']}" for r in ranks if r.get("message"))
    if "oom" in by:
        return "oom", msgs
    if host_oom_kills > 0 and returncode != 0 and not timed_out and world is not None and len(ranks) < world:
        # a rank the kernel killed for host memory writes nothing: the memory cgroup's counter says why it died.
        # Only for a run that failed with a rank result missing: another run sharing the cgroup may have been the one
        # killed, and a rank that failed on its own wrote its error
        return "oom", (f"the kernel's OOM killer killed {host_oom_kills} process(es) of this memory cgroup during the "
                       f"run (host memory, not the accelerator's); launcher exited {returncode} with {len(ranks)} rank "
                       "result(s)" + (f"; {msgs}" if msgs else ""))
    if timed_out:
        return "timeout", "killed after timeout_s (hung collective or too slow)" + (f"; {msgs}" if msgs else "")
    if "error" in by:
        return "error", msgs
    if returncode != 0 or not ranks or "ok" not in by:
        return "error", f"launcher exited {returncode} with {len(ranks)} rank result(s)" + (f"; {msgs}" if msgs else "")
    return "ok", ""


def assemble_record(spec: dict[str, Any], ranks: list[dict], *, timed_out: bool, returncode: int,
                    wall_s: float, host_oom_kills: int = 0) -> dict[str, Any]:
    """One RECORD: rank 0's measurements, every rank's state bytes, analytic predictions beside them.
    ``host_oom_kills``: processes the kernel's OOM killer killed in the run's memory cgroup while it ran
    (:func:`trainplan.proxy.torchrun.oom_kills`); a failed run with any is ``oom``."""
    status, message = _status(ranks, timed_out, returncode, host_oom_kills,
                              world=int(spec["nproc_per_node"]) * int(spec.get("nnodes", 1)))
    ok = sorted((r for r in ranks if r.get("status") == "ok"), key=lambda r: r["rank"])
    r0 = ok[0] if ok and status == "ok" else {}
    mspec, layout = ModelSpec.from_dict(spec["model"]), Layout.from_dict(spec["layout"])
    accum = r0.get("accum", 1)
    fl = r0.get("flops", {})
    analytic_fl = analytic.analytic_flops(mspec, spec["seq_len"], layout.micro_batch, accum, layout.tp,
                                         layout.recompute, finetune=spec["finetune"], lora_rank=spec["lora_rank"],
                                         lora_targets=spec["lora_targets"])
    analytic_mem = analytic.analytic_memory(mspec, layout, spec["seq_len"], spec["global_batch"], spec["dtype"],
                                           spec["finetune"], spec["lora_rank"], spec["lora_targets"], spec["device"])
    env = dict(r0.get("environment", {}))
    hosts = {r["environment"]["hostname"] for r in ok if "environment" in r}
    slurm_nodes = sorted({r["environment"].get("slurm_node") for r in ok if "environment" in r} - {None})
    env.pop("hostname", None)
    env.pop("slurm_node", None)
    env["hostname_count"] = len(hosts)
    env["slurm_nodes"] = slurm_nodes  # the Slurm nodes the ranks ran on ([] outside Slurm)
    total = fl.get("total")
    rec: dict[str, Any] = {
        "schema_version": 1, "id": spec["id"], "family": spec["family"], "status": status, "message": message,
        "spec": spec, "layout_family": layout.family, "layout_describe": layout.describe(),
        "environment": env,
        "timing": {**r0.get("timing", {}), "wall_s": wall_s},
        "loss": r0.get("loss", []),
        "flops": {
            "measured_total_per_rank_step": total,
            "attention_recompute_per_rank_step": fl.get("attention_recompute"),
            "measured_model_per_rank_step": None if total is None else total - fl["attention_recompute"],
            "analytic_model_per_rank_step": analytic_fl["model_flops_per_rank_step"] if analytic_fl else None,
            "analytic_hardware_per_rank_step": analytic_fl["hardware_flops_per_rank_step"] if analytic_fl else None,
            "by_op": fl.get("by_op", {}),
        },
        "memory": {
            "state_bytes_per_rank": [r["state"] for r in ok],
            "saved_activations": r0.get("saved"),
            "footprint_bytes_per_rank": [r["footprint_bytes"] for r in ok],
            "cuda_max_allocated_bytes": r0.get("cuda", {}).get("max_allocated_bytes"),
            "cuda_max_reserved_bytes": r0.get("cuda", {}).get("max_reserved_bytes"),
            "mem_limit_bytes": spec.get("mem_limit_bytes"),
        },
        "comm": r0.get("comm", {}),
        "params": r0.get("params", {"module": None, "spec": mspec.n_params, "trainable": None}),
        "predicted": {"exact_state_bytes": ok[0]["exact_state"] if ok else None,
                      "memory": analytic_mem, "flops": analytic_fl},
    }
    if status != "ok":
        tb = [r.get("traceback") for r in ranks if r.get("traceback")]
        if tb:
            rec["traceback"] = tb[0]
    validate_record(rec)
    return rec
