"""One decode step of a Llama-style decoder layer (or ``bench.layers`` of them) for a batch
of B sequences over ``bench.tp`` tensor-parallel PEs (kernel
:func:`kbframe.kernels.decoder_layer.decoder_layer`; DESIGN.md decision 12).

Each sequence has ``S_kv`` tokens in its KV cache and one new token at position
``positions[b]`` (generated: S_kv); layer l+1 takes layer l's output x. What a layer
computes (Hugging Face ``LlamaDecoderLayer``; its float64 reference is :meth:`DecoderLayer.reference`)::

    h = rmsnorm(x, attn_norm, eps);  q, k, v = h·wq, h·wk, h·wv;  q, k = rope(q, k, positions)
    K, V = k_cache ++ k, v_cache ++ v;  o = GQA attention of q over K, V (scale 1/sqrt(d))
    x = x + o·wo;  h = rmsnorm(x, ffn_norm, eps);  x = x + (silu(h·w_gate) · (h·w_up))·w_down

Inputs (an inputs file holds exactly these; weights stored (in, out), y = x·W, every
per-layer array with a leading layer axis L): ``x (B, H)``, ``attn_norm``, ``ffn_norm
(L, H)``, ``wq (L, H, H_q·d)``, ``wk``, ``wv (L, H, H_kv·d)``, ``wo (L, H_q·d, H)``,
``w_gate``, ``w_up (L, H, F)``, ``w_down (L, F, H)``, ``k_cache``, ``v_cache (L, B, H_kv,
S_kv, d)`` (keys already rotated), ``positions (B,)`` (integers), 0-d ``rope_theta`` and
``eps``. Outputs: ``out (B, H)`` (the last layer's residual stream, no final norm) and
``k_new``, ``v_new (L, B, H_kv, d)`` (each layer's appended key, rotated, and value).

HBM holds them in the layout tensor parallelism reads (each rank's part contiguous):
``wqkv`` (rank r's q, k and v columns side by side), ``w_gate_shards``/``w_up_shards``
(rank r's columns), ``wo`` and ``w_down`` as they are (rank r's rows), and ``k_rows``/
``v_rows``: every (layer, sequence, KV slot)'s cache with one more row for the new token. A
slot is a KV head; with ``bench.tp`` a multiple of H_kv, each rank has its own replica of one
KV head, its cache included (:func:`kbframe.kernels.decoder_layer.kv_slots`), so the caches
take tp / H_kv times the memory, as they do on GPUs that replicate KV heads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, HbmCapacityError, InputsError
from ..params import param
from ..kernels.attention import PARTIALS
from ..kernels.collectives import ALGORITHMS
from ..kernels.decoder_layer import FUSIONS, kv_slots
from .base import Workload
from .model import ModelConfig, preset_note

#: the inputs, as an inputs file and tensors.npz hold them
FILE_ARRAYS = ("x", "attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up", "w_down",
               "k_cache", "v_cache", "positions", "rope_theta", "eps")
#: where the ranks go (DecoderLayer.pes)
PLACEMENTS = ("packed", "spread")
#: positions must be exact in the float32 the positions tensor is stored in
MAX_POSITION = 2 ** 24


@dataclass
class DecoderLayerConfig(ModelConfig):
    """The model's dimensions (a preset sets them; Llama-3-8B's by default, as
    conf/bench/decoder_layer.yaml), the batch, the parallelism and the kernel's choices."""

    H: int = param(4096, lo=1, doc="hidden size")
    H_q: int = param(32, lo=1, hi=65536, doc="query heads")
    F: int = param(14336, lo=1, doc="FFN width (intermediate_size)")
    layers: int = param(1, lo=1, doc="decoder layers of the step (a model preset sets its model's count)")
    data: bool = param(False, doc="compute and check the numbers (a real layer's weights are large: timing only "
                                  "unless asked)")

    S_kv: int = param(4096, unit="keys", lo=0, doc="tokens already in each sequence's KV cache")
    batch: int = param(1, lo=1, hi=65536, doc="sequences B")
    tp: int = param(1, lo=1, doc="tensor-parallel PEs (divides H_kv, or a multiple of it dividing H_q; divides F)")
    placement: str = param("packed", doc="packed: rank r on PE r; spread: the ranks dealt over the cubes, rank r on "
                                         "cube r mod cubes")
    fusion: str = param("fused", doc="fused (the rmsnorm and swiglu recipes, RoPE and the residual adds as GEMM "
                                     "epilogues) or none (every op a command)")
    allreduce: str = param("ring", doc="ring | tree | direct")
    inner: str = param("opt2", doc="the attention inner loop: opt2 or opt3")
    tile: int = param(64, unit="keys", lo=1, doc="keys per KV tile")


class DecoderLayer(Workload):
    """Decoder layers of one decode step, tensor-parallel over ``bench.tp`` PEs."""

    Config = DecoderLayerConfig
    _file_shape = False  # an inputs file's dimensions are known (shape_from_file)
    unit = "layer"
    outputs = ("out", "k_new", "v_new")
    # layers repeat from the third on (PE_CPU's run-ahead settles in the first two); fused
    # layers on 8 PEs every 4 (each fourth 2 ns later). In one simulation the layer loop
    # may jump after 3 layers (a period of 1) or 12 (of 4); short copies, when those are
    # needed, start at 3 layers, and with a period of 4 take 54 of Llama-3-70B's 80
    ff_min_steps = 3
    ff_budget = 0.7
    ff_periods = (1, 2, 4)  # what a jump in one simulation is a multiple of (kbframe.sim.steady)
    ff_after = 1  # a layer's commands are thousands, PE_SCHEDULER's queue 64: the end cannot reach back a layer
    ff_weight_tiles = True  # its weight GEMVs' output tiles too

    # ---- checks ----------------------------------------------------------------------
    def validate(self) -> None:
        c = self.cfg
        if c.arch != "llama":
            raise ConfigError(f"{preset_note(c)}bench.arch='{c.arch}' is not a layer decoder_layer runs "
                              f"(it runs arch llama: RMSNorm, RoPE, GQA, SwiGLU)")
        if c.get("model_layers") is not None and c.layers > c.model_layers:
            source = f", from model preset '{c.model}'" if c.model else ""
            what = (f"the inputs file's {c.layers} layers (bench.inputs.path) are" if self._file_shape else
                    f"bench.layers={c.layers} is")
            raise ConfigError(f"{what} more than the model's {c.model_layers} (bench.model_layers{source}); set "
                              f"bench.model_layers={c.layers} too for a deeper model")
        if c.inputs.path is not None and not self._file_shape:
            return  # the shape checks below wait for the file's dimensions (validated again once applied)
        if c.H_q % c.H_kv:
            raise ConfigError(f"{preset_note(c)}query heads bench.H_q={c.H_q} are not a multiple of KV heads "
                              f"bench.H_kv={c.H_kv} (GQA needs H_q = G·H_kv)")
        if c.d % 2:
            raise ConfigError(f"bench.d={c.d} must be even (RoPE rotates the two halves of each head)")
        if c.tp > self.n_pes:
            raise ConfigError(f"bench.tp={c.tp} is more than the {self.n_pes} PE(s) of the topology "
                              f"(hardware.n_pes; one PE per rank, e.g. hardware=cube)")
        kv_split = not c.H_kv % c.tp or not (c.tp % c.H_kv or c.H_q % c.tp)
        if kv_split and c.F % c.tp:
            raise ConfigError(f"bench.tp={c.tp} must divide bench.F={c.F} (FFN columns are split evenly over the PEs)")
        if not kv_split or c.F % c.tp:
            raise ConfigError(f"bench.tp={c.tp} must divide bench.H_kv={c.H_kv} and bench.F={c.F} "
                              f"(KV heads and FFN columns are split evenly over the PEs), or be a multiple of "
                              f"bench.H_kv that divides bench.H_q={c.H_q} (each PE a replica of one KV head)")
        for key, known in (("fusion", FUSIONS), ("allreduce", ALGORITHMS), ("inner", tuple(PARTIALS)),
                           ("placement", PLACEMENTS)):
            if c[key] not in known:
                raise ConfigError(f"bench.{key} must be one of {', '.join(known)}, got '{c[key]}'")
        self._check_hbm_per_cube()

    def _check_hbm_per_cube(self) -> None:
        """Each cube's HBM holds the shards of the ranks on its PEs (and the small tensors
        every rank reads): ``hardware.hbm_bytes`` is the topology's, shared evenly by its
        cubes. ConfigError names the bytes a cube needs and has."""
        hw = self.hardware
        if hw is None or hw.get("hbm_bytes") is None:
            return
        c = self.cfg
        cubes, _ = self._cubes()
        ranks = np.bincount([pe // self._per_cube() for pe in self.pes()], minlength=cubes)
        if ranks.min() > 0 and ranks.max() == ranks.min():
            return  # every cube holds as many ranks' shards: the topology's HBM check covers it
        isz = np.dtype(c.dtype).itemsize
        need = sum(math.prod(s) for s in self.tensors().values()) * isz * int(ranks.max()) // int(c.tp)
        have = int(hw.hbm_bytes) // cubes
        if need > have:
            most = int(ranks.max())
            whose = "1 rank's" if most == 1 else f"{most} ranks'"
            fix = ("use more ranks (bench.tp), each a smaller shard" if c.placement == "spread" or most == 1 else
                   "spread the ranks over the cubes (bench.placement=spread) or use more ranks (bench.tp)")
            raise HbmCapacityError(f"bench.tp={c.tp} (bench.placement={c.placement}) puts {whose} shards, {need} B "
                                   f"({need / 2 ** 30:.3g} GiB), in one cube's HBM of {have} B ({have / 2 ** 30:.3g} "
                                   f"GiB: hardware.hbm_bytes over {cubes} cubes); {fix}", need, have)

    def _per_cube(self) -> int:
        hw = self.hardware
        return int(hw.get("pes_per_cube") or self.n_pes) if hw is not None else int(self.n_pes)

    def _cubes(self) -> tuple[int, int]:
        """``(cubes, PEs per cube)`` of the topology."""
        per = self._per_cube()
        return max(1, int(self.n_pes) // per), per

    def pes(self) -> list[int]:
        """Rank r's PE: ``r`` (``packed``), or cube ``r mod cubes``'s PE ``r div cubes``
        (``spread``: the ranks dealt over the cubes, so that each cube's HBM holds as many
        ranks' weights and caches)."""
        c = self.cfg
        if c.placement == "packed":
            return list(range(int(c.tp)))
        cubes, per = self._cubes()
        return [(r % cubes) * per + r // cubes for r in range(int(c.tp))]

    # ---- shapes ----------------------------------------------------------------------
    @property
    def G(self) -> int:
        return self.cfg.H_q // self.cfg.H_kv

    def file_shapes(self) -> dict:
        """Each input's shape, as a file holds it."""
        c = self.cfg
        L, B, H = c.layers, c.batch, c.H
        return {"x": (B, H), "attn_norm": (L, H), "wq": (L, H, c.H_q * c.d), "wk": (L, H, c.H_kv * c.d),
                "wv": (L, H, c.H_kv * c.d), "wo": (L, c.H_q * c.d, H), "ffn_norm": (L, H), "w_gate": (L, H, c.F),
                "w_up": (L, H, c.F), "w_down": (L, c.F, H), "k_cache": (L, B, c.H_kv, c.S_kv, c.d),
                "v_cache": (L, B, c.H_kv, c.S_kv, c.d), "positions": (B,), "rope_theta": (), "eps": ()}

    def tensors(self) -> dict:
        c = self.cfg
        L, B, H, P = c.layers, c.batch, c.H, c.tp
        slots = kv_slots(c.H_kv, P)
        cols = (c.H_q // P + 2 * (slots // P)) * c.d
        rows = L * B * slots * (c.S_kv + 1)
        return {"x": (B, H), "attn_norm": (L, H), "ffn_norm": (L, H), "positions": (B, 1),
                "wqkv": (L * P * H, cols), "wo": (L * c.H_q * c.d, H), "w_gate_shards": (L * P * H, c.F // P),
                "w_up_shards": (L * P * H, c.F // P), "w_down": (L * c.F, H),
                "k_rows": (rows, c.d), "v_rows": (rows, c.d), "out": (B, H)}

    def input_names(self) -> tuple:
        return FILE_ARRAYS

    def host_bytes(self) -> int:
        """The inputs twice (as given and in HBM's layout) as float64, the reference's
        temporaries and the HBM copies."""
        n_in = sum(math.prod(s) for s in self.file_shapes().values())
        return 8 * 3 * n_in + 8 * self.cfg.batch * self.cfg.H_q * (self.cfg.S_kv + 1) * 2

    # ---- inputs ----------------------------------------------------------------------
    def generate(self, rng: np.random.Generator) -> dict:
        """float32 inputs that keep the residual stream O(1): x standard normal, norms
        around 1, weights N(0, 1/fan_in), caches standard normal; every new token at
        position S_kv."""
        c = self.cfg
        shapes = self.file_shapes()
        fan_in = {"wq": c.H, "wk": c.H, "wv": c.H, "wo": c.H_q * c.d, "w_gate": c.H, "w_up": c.H, "w_down": c.F}
        out = {}
        for name in FILE_ARRAYS[:12]:
            a = rng.standard_normal(shapes[name])
            if name in fan_in:
                a /= math.sqrt(fan_in[name])
            elif name.endswith("_norm"):
                a = 1.0 + 0.1 * a
            out[name] = a.astype(np.float32)
        out["positions"] = np.full(c.batch, c.S_kv, dtype=np.int64)
        out["rope_theta"], out["eps"] = np.float64(c.rope_theta), np.float64(c.eps)
        return self._with_hbm_layout(out)

    def shape_from_file(self, arrays: dict, path: str) -> dict:
        """Every shape key from the file's arrays (and ``rope_theta``, ``eps``); an array
        whose shape contradicts the others, or a bad ``positions``, is an InputsError. From
        here on :meth:`validate` checks the parallelism against these dimensions."""
        self._file_shape = True
        x, wq, wk, wg, kc = arrays["x"], arrays["wq"], arrays["wk"], arrays["w_gate"], arrays["k_cache"]
        where = f"bench.inputs.path: '{path}'"
        if x.ndim != 2 or wq.ndim != 3 or wk.ndim != 3 or wg.ndim != 3 or kc.ndim != 5 or 0 in kc.shape[:3] \
                or 0 in x.shape or kc.shape[4] == 0:
            raise InputsError(f"{where}: x {x.shape}, wq {wq.shape}, wk {wk.shape}, w_gate {wg.shape}, k_cache "
                              f"{kc.shape} must be (B, H), (L, H, H_q·d), (L, H, H_kv·d), (L, H, F), "
                              f"(L, B, H_kv, S_kv, d)")
        L, B, H_kv, S, d = (int(n) for n in kc.shape)
        if wq.shape[2] % d:
            raise InputsError(f"{where}: wq {wq.shape} has {wq.shape[2]} columns, not a multiple of the head dim "
                              f"d={d} (k_cache {kc.shape})")
        shape = {"layers": L, "batch": B, "H": int(x.shape[1]), "H_q": int(wq.shape[2]) // d, "H_kv": H_kv,
                 "d": d, "F": int(wg.shape[2]), "S_kv": S}
        want = _file_shapes(shape)
        for name in FILE_ARRAYS:
            if tuple(arrays[name].shape) != want[name]:
                raise InputsError(f"{where}: array '{name}' has shape {tuple(arrays[name].shape)}, but the "
                                  f"others make it {want[name]} (L={L}, B={B}, H={shape['H']}, H_q={shape['H_q']}, "
                                  f"H_kv={H_kv}, d={d}, F={shape['F']}, S_kv={S})")
        pos = arrays["positions"]
        if not np.issubdtype(pos.dtype, np.integer) or pos.min() < 0 or pos.max() >= MAX_POSITION:
            raise InputsError(f"{where}: positions must be integers in [0, {MAX_POSITION}), got "
                              f"{pos.dtype} from {pos.min()} to {pos.max()}")
        for key in ("rope_theta", "eps"):
            v = float(arrays[key])
            if not (math.isfinite(v) and v > 0):
                raise InputsError(f"{where}: {key} must be a finite number > 0, got {v}")
            shape[key] = v
        c = self.cfg
        differ = [k for k in ("H", "H_q", "H_kv", "d", "F") if shape[k] != int(c[k])]
        if c.model and differ:  # a preset's name (and layer count) would describe another model
            raise InputsError(f"{where}: its {', '.join(f'{k}={shape[k]}' for k in differ)} are not those of model "
                              f"preset '{c.model}' ({', '.join(f'{k}={c[k]}' for k in differ)}); drop "
                              f"+model={c.model} to run the file's own model")
        return shape

    def accept_file(self, arrays: dict, path: str) -> dict:
        out = {n: np.asarray(arrays[n], dtype=np.float64) for n in FILE_ARRAYS if n != "positions"}
        out["positions"] = np.asarray(arrays["positions"], dtype=np.int64)
        return self._with_hbm_layout(out)

    def _with_hbm_layout(self, inp: dict) -> dict:
        """``inp`` plus the HBM tensors made from it (the module doc's layout)."""
        c = self.cfg
        L, B, H, P, d = c.layers, c.batch, c.H, c.tp, c.d
        slots = kv_slots(c.H_kv, P)
        rep = slots // c.H_kv  # replicas of each KV head (1 unless tp > H_kv)
        hq, hkv, fp = c.H_q // P, slots // P, c.F // P
        qkv = np.empty((L, P, H, (hq + 2 * hkv) * d), dtype=inp["wq"].dtype)
        gate = np.empty((L, P, H, fp), dtype=inp["w_gate"].dtype)
        up = np.empty_like(gate)
        for r in range(P):
            heads = [(r * hkv + j) // rep for j in range(hkv)]  # the KV heads of rank r's slots
            kv_cols = np.concatenate([np.arange(h * d, (h + 1) * d) for h in heads])
            qkv[:, r] = np.concatenate([inp["wq"][:, :, r * hq * d:(r + 1) * hq * d],
                                        inp["wk"][:, :, kv_cols], inp["wv"][:, :, kv_cols]], axis=2)
            gate[:, r] = inp["w_gate"][:, :, r * fp:(r + 1) * fp]
            up[:, r] = inp["w_up"][:, :, r * fp:(r + 1) * fp]
        hbm = {"wqkv": qkv, "w_gate_shards": gate, "w_up_shards": up}
        for side in ("k", "v"):  # the HBM tensors take these in row-major order (positions as (B, 1))
            rows = np.zeros((L, B, slots, c.S_kv + 1, d), dtype=inp[f"{side}_cache"].dtype)
            rows[:, :, :, :c.S_kv] = np.repeat(inp[f"{side}_cache"], rep, axis=2)
            hbm[f"{side}_rows"] = rows
        return {**inp, **hbm}

    # ---- the run ---------------------------------------------------------------------
    def programs(self, kernel, make_tl, inputs: dict | None) -> dict:
        kw = self.kernel_kwargs(inputs)
        progs = {}
        for r, pe in enumerate(self.pes()):
            tl = make_tl(pe)
            progs[pe] = (lambda tl=tl, kw={**kw, "rank": r}: kernel(tl, **kw))
        return progs

    def kernel_kwargs(self, inputs: dict | None) -> dict:
        c = self.cfg
        return dict(rank=0, pes=self.pes(), B=int(c.batch), H=c.H, H_q=c.H_q, H_kv=c.H_kv, d=c.d,
                    F=c.F, S_kv=int(c.S_kv), layers=int(c.layers), eps=float(c.eps), rope_theta=float(c.rope_theta),
                    tile=int(c.tile), inner=c.inner, fusion=c.fusion, allreduce=c.allreduce,
                    scale=1.0 / math.sqrt(c.d))

    def n_units(self) -> int:
        return int(self.cfg.layers)

    def periodic_axis(self) -> tuple[str, int] | None:
        # every layer the same work (timing only); generated inputs: the shapes are the keys'
        return ("layers", 1) if self.cfg.inputs.path is None else None

    def nested_axes(self) -> tuple:
        # each layer's attention loops over the KV tiles (kbframe.kernels.attention)
        return ("S_kv",) if self.periodic_axis() is not None else ()

    def tokens(self) -> int:
        return int(self.cfg.batch)

    def model_layers(self) -> int | None:
        m = self.cfg.get("model_layers")
        return int(m) if m is not None and int(m) > int(self.cfg.layers) else None

    def whole_model(self) -> "DecoderLayer | None":
        n = self.model_layers()
        if n is None:
            return None
        w = self.with_key("layers", n)
        w._file_shape = self._file_shape  # the dimensions an inputs file gave are checked as they are
        w.validate()
        return w

    def progress_stream(self) -> tuple[str, int]:
        return "w_down", int(self.cfg.F)

    def shape(self) -> dict:
        c = self.cfg
        return {"model": c.model, "B": int(c.batch), "H": c.H, "H_q": c.H_q, "H_kv": c.H_kv, "G": self.G, "d": c.d,
                "F": c.F, "S_kv": int(c.S_kv), "layers": int(c.layers), "tp": int(c.tp),
                **({"placement": c.placement} if c.placement != "packed" else {}), "fusion": c.fusion,
                "allreduce": c.allreduce, "inner": c.inner, "tile": int(c.tile)}

    def read_outputs(self, read) -> dict:
        """``out`` from HBM, and each layer's appended key and value from the caches' last rows
        (of each KV head's first replica)."""
        c = self.cfg
        slots = kv_slots(c.H_kv, int(c.tp))
        got = {"out": read("out")}
        for side in ("k", "v"):
            rows = read(f"{side}_rows").reshape(c.layers, c.batch, slots, c.S_kv + 1, c.d)
            got[f"{side}_new"] = rows[:, :, ::slots // c.H_kv, c.S_kv]
        return got

    # ---- numbers ---------------------------------------------------------------------
    def reference(self, inputs: dict) -> dict:
        """float64 layers, written from the formula (module doc), not from the kernel."""
        return reference_layers(inputs, self.cfg.H_q, self.cfg.H_kv)

    def saved_scalars(self, inputs: dict) -> dict:
        return {}


def _file_shapes(s: dict) -> dict:
    L, B, H, d = s["layers"], s["batch"], s["H"], s["d"]
    return {"x": (B, H), "attn_norm": (L, H), "wq": (L, H, s["H_q"] * d), "wk": (L, H, s["H_kv"] * d),
            "wv": (L, H, s["H_kv"] * d), "wo": (L, s["H_q"] * d, H), "ffn_norm": (L, H), "w_gate": (L, H, s["F"]),
            "w_up": (L, H, s["F"]), "w_down": (L, s["F"], H), "k_cache": (L, B, s["H_kv"], s["S_kv"], d),
            "v_cache": (L, B, s["H_kv"], s["S_kv"], d), "positions": (B,), "rope_theta": (), "eps": ()}


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope64(t, pos, theta):
    """``t (B, heads, d)`` rotated at ``pos (B,)`` (Hugging Face ``apply_rotary_pos_emb``)."""
    d = t.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    freqs = np.outer(pos.astype(np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)[:, None, :]
    rotated = np.concatenate([-t[..., d // 2:], t[..., :d // 2]], axis=-1)
    return t * np.cos(emb) + rotated * np.sin(emb)


def reference_layers(inp: dict, H_q: int, H_kv: int) -> dict:
    """float64 decode step of every layer of ``inp`` (the module doc's formula):
    ``{"out": (B, H), "k_new", "v_new": (L, B, H_kv, d)}``."""
    f = {n: np.asarray(inp[n], dtype=np.float64) for n in FILE_ARRAYS if n != "positions"}
    pos = np.asarray(inp["positions"])
    eps, theta = float(f["eps"]), float(f["rope_theta"])
    x = f["x"].copy()
    B = x.shape[0]
    L, _, _, S, d = f["k_cache"].shape
    G = H_q // H_kv
    k_new = np.empty((L, B, H_kv, d))
    v_new = np.empty((L, B, H_kv, d))
    for layer in range(L):
        h = _rms(x, f["attn_norm"][layer], eps)
        q = _rope64((h @ f["wq"][layer]).reshape(B, H_q, d), pos, theta)
        k = _rope64((h @ f["wk"][layer]).reshape(B, H_kv, d), pos, theta)
        v = (h @ f["wv"][layer]).reshape(B, H_kv, d)
        k_new[layer], v_new[layer] = k, v
        K = np.concatenate([f["k_cache"][layer], k[:, :, None, :]], axis=2)  # (B, H_kv, S + 1, d)
        V = np.concatenate([f["v_cache"][layer], v[:, :, None, :]], axis=2)
        s = np.einsum("bhgd,bhsd->bhgs", q.reshape(B, H_kv, G, d), K) / math.sqrt(d)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        o = np.einsum("bhgs,bhsd->bhgd", p, V).reshape(B, H_q * d)
        x = x + o @ f["wo"][layer]
        h = _rms(x, f["ffn_norm"][layer], eps)
        g = h @ f["w_gate"][layer]
        x = x + (g / (1.0 + np.exp(-g)) * (h @ f["w_up"][layer])) @ f["w_down"][layer]
    return {"out": x, "k_new": k_new, "v_new": v_new}
