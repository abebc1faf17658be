"""One decode step of Llama-style decoder layers on one tensor-parallel rank (the
``decoder_layer`` workload, :mod:`kbframe.workloads.decoder_layer`; DESIGN.md decision 12).

Per layer, for B sequences whose new token is the residual stream ``x (B, H)`` (Hugging
Face ``LlamaDecoderLayer``)::

    h = rmsnorm(x, attn_norm);  q, k, v = h·wq, h·wk, h·wv;  q, k = rope(q, k, pos)
    K, V = cache ++ k, cache ++ v;  o = attention(q, K, V);  x = x + o·wo
    h = rmsnorm(x, ffn_norm);  x = x + (silu(h·w_gate) · (h·w_up))·w_down

Rank r of P (``pes[r]``) holds KV heads ``r·H_kv/P ..`` and their query heads (its columns
of wq, wk, wv packed as one QKV weight, its rows of wo); with P a multiple of H_kv, a replica
of KV head ``r·H_kv/P`` (its k, v columns and its own copy of the cache) and ``H_q/P`` of its
query heads (:func:`kv_slots`). It holds FFN columns ``r·F/P ..`` (of
w_gate, w_up; its rows of w_down); every rank computes the norms on the full x, and the
partial sums of o·wo and of the down projection are all-reduced over IPCQ
(:mod:`kbframe.kernels.collectives`) before the residual add. Attention per (sequence,
KV head) reuses the decode inner loops (:data:`kbframe.kernels.attention.PARTIALS`) over
the S_kv + 1 keys of the cache, after the new key and value are stored into it (a DMA
write each).

``fusion``:

* ``none``: every op a primitive command (RMSNorm's six micro-ops, each GEMM, RoPE, SiLU,
  the product, the residual adds);
* ``fused``: RMSNorm is the ``rmsnorm`` prologue recipe of the QKV GEMM and RoPE its
  epilogue; the FFN's RMSNorm one composite of the same recipe; SwiGLU the ``swiglu``
  prologue recipe of the down projection; the residual add is the epilogue of the o- and
  down projections on rank 0 (added once, before the all-reduce sums the ranks).

Commands are grouped in phases (``tl.phase``) for the reports: ``norm``, ``qkv``,
``rope``, ``kv_append``, ``attention``, ``o_proj``, ``all_reduce``, ``residual``, ``ffn``
(fused: ``norm+qkv+rope``, ``o_proj+residual``, ``ffn+residual``), each with its layer,
its least HBM traffic (weights and KV cache read once) and its FLOPs: what an analytic
roofline estimate of the phase takes.
"""
from __future__ import annotations

from .attention import PARTIALS
from .collectives import all_reduce

FUSIONS = ("none", "fused")


def kv_slots(H_kv: int, P: int) -> int:
    """KV-cache slots of ``P`` tensor-parallel ranks: ``H_kv`` when ``P`` divides ``H_kv``
    (each rank holds ``H_kv / P`` KV heads); ``P`` when ``P`` is a multiple of ``H_kv`` (each
    rank holds a replica of one KV head, its cache included, and ``H_q / P`` of that head's
    query heads, as vLLM replicates KV heads when tensor parallelism exceeds them)."""
    return max(H_kv, P)


def _rmsnorm(tl, x, gamma, eps_t):
    """RMSNorm of ``x (B, H)`` as six primitive MATH commands (``recipes/rmsnorm.yaml``'s steps)."""
    sq = tl.mul_bcast(x, x)
    ms = tl.math("rmean", sq)
    inv = tl.math("rsqrt", tl.add(ms, eps_t))
    return tl.mul_bcast(tl.mul_bcast(x, inv), gamma)


def decoder_layer(tl, *, rank: int, pes: list, B: int, H: int, H_q: int, H_kv: int, d: int, F: int, S_kv: int,
                  layers: int, eps: float, rope_theta: float, tile: int, inner: str, fusion: str, allreduce: str,
                  scale: float) -> None:
    """``layers`` decoder layers of one decode step on rank ``rank`` of ``pes``.

    HBM tensors (the workload's layout): ``x (B, H)``, ``attn_norm``/``ffn_norm (L, H)``,
    ``positions (B, 1)``, ``wqkv (L·P·H, C)`` (rank r's block of layer l at rows
    ``(l·P + r)·H``, its columns ``[q heads | k heads | v heads]``, C = (H_q + 2·H_kv)·d / P),
    ``wo (L·H_q·d, H)``, ``w_gate_shards``/``w_up_shards (L·P·H, F/P)``, ``w_down (L·F, H)``,
    ``k_rows``/``v_rows (L·B·S·(S_kv + 1), d)`` with S = :func:`kv_slots` (slot s of (l, b) at rows
    ``((l·B + b)·S + s)·(S_kv + 1)``, its last row the new token's; rank r holds slots
    ``r·S/P ..``) and the output ``out (B, H)``, stored by rank 0.
    """
    P = len(pes)
    slots = kv_slots(H_kv, P)  # KV heads, each replicated on P / H_kv ranks when P > H_kv
    hq, hkv, fp = H_q // P, slots // P, F // P
    G = hq // hkv  # this rank's query heads per KV head
    nh = hq + 2 * hkv  # head rows of a token in the QKV output
    C = nh * d
    fused = fusion == "fused"
    ref = tl.ref
    x_h, pos_h = ref("x"), ref("positions")
    attn_norm, ffn_norm = ref("attn_norm"), ref("ffn_norm")
    wqkv, wo, w_down = ref("wqkv"), ref("wo"), ref("w_down")
    w_gate, w_up = ref("w_gate_shards"), ref("w_up_shards")
    kc, vc = ref("k_rows"), ref("v_rows")
    rope = dict(theta=float(rope_theta), head_dim=d, rotary_cols=(hq + hkv) * d)
    isz = x_h.nbytes // x_h.n_elements  # bytes per element (the timing dtype)
    n_items = B * hkv
    # each phase's least HBM traffic and its FLOPs, for the analytic estimate beside the
    # simulation (kbframe.run.phases): weights and the KV cache read once, nothing else
    qkv_cost = dict(hbm_bytes=(H * C + H) * isz, flops=2 * B * H * C)
    kv_cost = dict(hbm_bytes=2 * n_items * d * isz, flops=0)
    attn_cost = dict(hbm_bytes=2 * n_items * (S_kv + 1) * d * isz, flops=4 * n_items * G * (S_kv + 1) * d)
    o_cost = dict(hbm_bytes=hq * d * H * isz, flops=2 * B * hq * d * H)
    ffn_cost = dict(hbm_bytes=3 * H * fp * isz, flops=6 * B * H * fp)
    norm_cost = dict(hbm_bytes=H * isz, flops=0)
    with tl.phase("load", hbm_bytes=(B * H + B) * isz, flops=0):
        x = tl.load(x_h, out=tl.empty((B, H), "x"))
        xb = tl.empty((B, H), "x_next")
        pos = tl.load(pos_h)
        eps_t = tl.full((1, 1), float(eps), "eps")
    for l in tl.steps("layers", layers, rings=(2,)):  # x and x_next swap every layer
        wb = (l * P + rank) * H  # this rank's block of the column-split weights
        with tl.scratch_scope():
            # ---- attention block
            if fused:
                with tl.phase("norm+qkv+rope", layer=l, **qkv_cost):
                    g = tl.load(attn_norm[l:l + 1])
                    qkv = tl.composite(prologue=[{"op": "rmsnorm", "x": x, "gamma": g, "eps": eps_t}], op="gemm",
                                       b=wqkv[wb:wb + H], out=tl.empty((B, C), "qkv"),
                                       epilogue=[{"op": "rope", "pos": pos, **rope}])
            else:
                with tl.phase("norm", layer=l, **norm_cost):
                    h = _rmsnorm(tl, x, tl.load(attn_norm[l:l + 1]), eps_t)
                with tl.phase("qkv", layer=l, hbm_bytes=H * C * isz, flops=2 * B * H * C):
                    qkv = tl.dot(h, wqkv[wb:wb + H], out=tl.empty((B, C), "qkv"))
                with tl.phase("rope", layer=l, hbm_bytes=0, flops=0):  # on the QKV output in TCM
                    tl.math("rope", qkv, pos, out=qkv, **rope)
            heads = tl.reshape(qkv, (B * nh, d))
            o = tl.empty((B, hq * d), "attn_out")
            o_heads = tl.reshape(o, (B * hq, d))
            items = [(b, j, ((l * B + b) * slots + rank * hkv + j) * (S_kv + 1)) for b in range(B) for j in range(hkv)]
            with tl.phase("kv_append", layer=l, **kv_cost):
                for b, j, r0 in items:
                    k_row = b * nh + hq + j
                    tl.store(kc[r0 + S_kv:r0 + S_kv + 1], heads[k_row:k_row + 1])
                    tl.store(vc[r0 + S_kv:r0 + S_kv + 1], heads[k_row + hkv:k_row + hkv + 1])
            with tl.phase("attention", layer=l, **attn_cost):
                for b, j, r0 in items:
                    with tl.scratch_scope():
                        q0 = b * nh + j * G
                        m, lsum, O = PARTIALS[inner](tl, heads[q0:q0 + G], kc[r0:r0 + S_kv + 1], vc[r0:r0 + S_kv + 1],
                                                     G=G, d=d, S_kv=S_kv + 1, tile=tile, scale=scale)
                        o0 = b * hq + j * G
                        tl.div_bcast(O, lsum, out=o_heads[o0:o0 + G])
            ob = l * H_q * d + rank * hq * d
            residual = [{"op": "add", "other": x}] if fused and rank == 0 else []
            with tl.phase("o_proj+residual" if fused else "o_proj", layer=l, **o_cost):
                if fused:
                    tl.composite(op="gemm", a=o, b=wo[ob:ob + hq * d], out=xb, epilogue=residual)
                else:
                    tl.dot(o, wo[ob:ob + hq * d], out=xb)
            all_reduce(tl, xb, pes=pes, rank=rank, algorithm=allreduce, name="all_reduce", layer=l)
            x, xb = _residual(tl, x, xb, fused, l)
        with tl.scratch_scope():
            # ---- FFN block
            with tl.phase("norm", layer=l, **norm_cost):
                g = tl.load(ffn_norm[l:l + 1])
                if fused:
                    h = tl.composite(op=None, prologue=[{"op": "rmsnorm", "x": x, "gamma": g, "eps": eps_t}])
                else:
                    h = _rmsnorm(tl, x, g, eps_t)
            db = l * F + rank * fp
            with tl.phase("ffn+residual" if fused else "ffn", layer=l, **ffn_cost):
                gate = tl.dot(h, w_gate[wb:wb + H]) if not fused else \
                    tl.composite(op="gemm", a=h, b=w_gate[wb:wb + H])
                up = tl.dot(h, w_up[wb:wb + H]) if not fused else tl.composite(op="gemm", a=h, b=w_up[wb:wb + H])
                if fused:
                    residual = [{"op": "add", "other": x}] if rank == 0 else []
                    tl.composite(prologue=[{"op": "swiglu", "gate": gate, "up": up}], op="gemm",
                                 b=w_down[db:db + fp], out=xb, epilogue=residual)
                else:
                    a = tl.mul_bcast(tl.math("silu", gate), up)
                    tl.dot(a, w_down[db:db + fp], out=xb)
            all_reduce(tl, xb, pes=pes, rank=rank, algorithm=allreduce, name="all_reduce", layer=l)
            x, xb = _residual(tl, x, xb, fused, l)
    if rank == 0:
        with tl.phase("store", hbm_bytes=B * H * isz, flops=0):
            tl.store(ref("out"), x)


def _residual(tl, x, total, fused: bool, layer: int):
    """After an all-reduce: ``(new x, the free buffer)``. Fused, the sum already holds the
    residual (rank 0's epilogue added x); else ``x ← x + total`` (one MATH add)."""
    if fused:
        return total, x
    with tl.phase("residual", layer=layer, hbm_bytes=0, flops=0):
        tl.add(x, total, out=x)
    return x, total
