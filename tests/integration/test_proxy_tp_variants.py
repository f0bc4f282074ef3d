"""TP (2 gloo ranks on the CPU), with and without SP, on the non-Llama parts of the proxy model: learned positions
(GPT-2, OPT), BLOOM's embedding LayerNorm, a GELU MLP and biases everywhere. The tensor-parallel model must give
the single-rank model's loss and every gradient (DTensor gradients gathered), and hold on each rank the parameters
the memory model counts (the position table whole, as Megatron keeps it): a position table or a norm left out of
the TP plan either crashes (positions added to a sequence shard) or trains each rank's copy apart (a plain norm on
sequence shards gets a different gradient on each rank)."""

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

WORKER = textwrap.dedent('''
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from trainplan.model import memory
    from trainplan.model.arch import ModelSpec
    from trainplan.proxy.model import build_model
    from trainplan.proxy.parallelize import apply_tp

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2,))
    cases = [dict(pos_embedding="learned", mlp="gelu", pos_offset=2),
             dict(pos_embedding="alibi", mlp="gelu", embed_norm=True),
             dict(pos_embedding="learned", embed_norm=True)]
    for sp in (True, False):
        for kw in cases:
            spec = ModelSpec(layers=2, hidden=64, heads=4, kv_heads=2, vocab=128, norm="layernorm", bias="all",
                             max_seq_len=64, **kw)
            x = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(1))
            ref = build_model(spec, seed=0)
            ref_loss = ref(x).float().pow(2).mean()
            ref_loss.backward()
            m = build_model(spec, seed=0)
            apply_tp(m, mesh, sp=sp)
            loss = m(x).float().pow(2).mean()
            loss.backward()
            grads = dict(ref.named_parameters())
            bad = [n for n, p in m.named_parameters()
                   if not torch.allclose(p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad,
                                         grads[n].grad, rtol=1e-4, atol=1e-6)]
            local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in m.parameters())
            per_rank = memory.stage_params(spec, 2, 1, "first")  # the memory model's parameters on one TP rank
            ok = torch.allclose(loss, ref_loss, rtol=1e-6) and not bad and local == per_rank["matmul"] + per_rank["other"]
            if dist.get_rank() == 0:
                print("CASE", sp, sorted(kw), "ok" if ok else f"FAIL loss {float(loss)} vs {float(ref_loss)}; {bad}; "
                      f"{local} parameters on rank 0, the memory model {per_rank}")
    dist.destroy_process_group()
''')


def test_tp_matches_one_rank_for_learned_positions_embedding_norm_and_gelu(tmp_path):
    script = tmp_path / "tp_variants.py"
    script.write_text(WORKER)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(script)], capture_output=True, text=True, timeout=300)
    cases = [ln for ln in p.stdout.splitlines() if ln.startswith("CASE")]
    assert p.returncode == 0 and len(cases) == 6, p.stderr[-3000:]
    assert all(ln.endswith(" ok") for ln in cases), "\n".join(cases)
