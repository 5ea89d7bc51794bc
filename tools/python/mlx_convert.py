"""MLX affine quantization and Hugging Face <-> MLX checkpoint layout conversion.

Pure numpy (no torch, no mlx), so it runs both here and on the GPU box. The
semantics follow docs/architecture.md (section 3 for names, 3.5 for the
quantizer); the C engine's loader is tested against files written here, so
this module is the single place where the layout rules live on the Python
side.

Tensors are numpy arrays keyed by name. bfloat16 has no numpy dtype, so a
bf16 tensor is carried as a `BF16` wrapper around its raw uint16 bits.
"""

import json
import struct

import numpy as np

# --------------------------------------------------------------------------
# bfloat16


class BF16:
    """Raw bfloat16 bits (uint16) with the shape of the tensor."""

    __slots__ = ("bits",)

    def __init__(self, bits):
        assert bits.dtype == np.uint16
        self.bits = bits

    @property
    def shape(self):
        return self.bits.shape

    def to_f32(self):
        return bf16_bits_to_f32(self.bits)


def f32_to_bf16_bits(a):
    """Round-to-nearest-even fp32 -> bf16 (what torch and mlx do on a cast)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    rounding = ((u >> 16) & 1) + 0x7FFF
    out = ((u + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def bf16_bits_to_f32(bits):
    return (np.ascontiguousarray(bits).astype(np.uint32) << 16).view(np.float32)


def bf16_round(a):
    """fp32 values rounded through bf16 (exactly representable afterwards)."""
    return bf16_bits_to_f32(f32_to_bf16_bits(a))


def as_f32(t):
    if isinstance(t, BF16):
        return t.to_f32()
    return np.asarray(t, dtype=np.float32)


# --------------------------------------------------------------------------
# MLX affine quantization (architecture.md 3.5)


def quantize(w, group_size=64, bits=4):
    """Quantize w [..., out, in] (fp32 math) the way mlx.core.quantize does.

    Returns (packed uint32 [..., out, in*bits/32], scales BF16 [..., out, in/gs],
    biases BF16 [..., out, in/gs]). q is computed with the fp32 scale and edge,
    which are then stored rounded to bf16, exactly as mlx does; the stored
    (scales, biases, q) triple therefore defines the quantized function.
    """
    if bits not in (4, 8):
        raise ValueError(f"only 4 and 8 bits are supported here, got {bits}")
    w = np.asarray(w, dtype=np.float32)
    if w.shape[-1] % group_size:
        raise ValueError(f"in-dim {w.shape[-1]} is not a multiple of group {group_size}")
    n = float((1 << bits) - 1)
    g = w.reshape(*w.shape[:-1], w.shape[-1] // group_size, group_size)
    mn = g.min(axis=-1)
    mx = g.max(axis=-1)
    s = np.maximum((mx - mn) / np.float32(n), np.float32(1e-7)).astype(np.float32)
    use_mn = np.abs(mn) > np.abs(mx)
    # Scales may be negative: the edge with the larger magnitude is the one that
    # must be exact, so the grid is anchored there (see gotcha 12).
    s = np.where(use_mn, s, -s).astype(np.float32)
    edge = np.where(use_mn, mn, mx).astype(np.float32)
    q0 = np.rint(edge / s).astype(np.float32)
    nz = q0 != 0
    s = np.where(nz, edge / np.where(nz, q0, 1), s).astype(np.float32)
    bias = np.where(nz, edge, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint((g - bias[..., None]) / s[..., None]), 0, n).astype(np.uint32)
    q = q.reshape(w.shape)
    return pack(q, bits), BF16(f32_to_bf16_bits(s)), BF16(f32_to_bf16_bits(bias))


def pack(q, bits):
    """Pack integer codes [..., in] LSB-first into uint32 words."""
    per = 32 // bits
    q = q.astype(np.uint32).reshape(*q.shape[:-1], q.shape[-1] // per, per)
    out = np.zeros(q.shape[:-1], dtype=np.uint32)
    for j in range(per):
        out |= q[..., j] << np.uint32(bits * j)
    return out


def unpack(wq, bits, in_dim):
    per = 32 // bits
    mask = np.uint32((1 << bits) - 1)
    q = np.stack([(wq >> np.uint32(bits * j)) & mask for j in range(per)], axis=-1)
    q = q.reshape(*wq.shape[:-1], wq.shape[-1] * per)
    if q.shape[-1] != in_dim:
        raise ValueError(f"packed width {q.shape[-1]} != in-dim {in_dim}")
    return q


def dequantize(wq, scales, biases, group_size=64, bits=4):
    """w = scale * q + bias in fp32, scales/biases read from their stored bf16."""
    s = as_f32(scales)
    b = as_f32(biases)
    in_dim = s.shape[-1] * group_size
    q = unpack(np.asarray(wq, dtype=np.uint32), bits, in_dim).astype(np.float32)
    q = q.reshape(*q.shape[:-1], s.shape[-1], group_size)
    w = s[..., None] * q + b[..., None]
    return w.reshape(*w.shape[:-2], in_dim).astype(np.float32)


# --------------------------------------------------------------------------
# safetensors (written by hand: numpy has no bf16 and we need U32 + metadata)

_DT_OUT = {np.dtype(np.float32): "F32", np.dtype(np.uint32): "U32", np.dtype(np.int32): "I32",
           np.dtype(np.int64): "I64", np.dtype(np.float16): "F16", np.dtype(np.uint8): "U8"}
_DT_IN = {"F32": np.float32, "U32": np.uint32, "I32": np.int32, "I64": np.int64, "F16": np.float16,
          "U8": np.uint8, "BF16": np.uint16}


def save_safetensors(path, tensors, metadata=None):
    header = {}
    blobs = []
    off = 0
    for name in sorted(tensors):
        t = tensors[name]
        if isinstance(t, BF16):
            dt, arr = "BF16", np.ascontiguousarray(t.bits)
        else:
            arr = np.ascontiguousarray(t)
            if arr.dtype not in _DT_OUT:
                raise ValueError(f"{name}: unsupported dtype {arr.dtype}")
            dt = _DT_OUT[arr.dtype]
        raw = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)  # keep the data section 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        arr = np.frombuffer(data[base + a:base + b], dtype=_DT_IN[h["dtype"]]).reshape(h["shape"]).copy()
        out[name] = BF16(arr) if h["dtype"] == "BF16" else arr
    return out, meta


# --------------------------------------------------------------------------
# layout conversion

QWEN35_ARCHS = ("qwen3_5", "qwen3_5_moe")
ARCHS = ("qwen3_5", "qwen3_5_moe", "qwen2", "mistral")

# Zero-centred RMSNorm weights of Qwen3.5 (HF computes x*(1+w)); mlx-lm stores 1+w.
_SHIFTED_NORM_SUFFIXES = ("input_layernorm.weight", "post_attention_layernorm.weight",
                          "self_attn.q_norm.weight", "self_attn.k_norm.weight")
_FINAL_NORM = "model.norm.weight"

# Modules quantized at 8 bits in mlx-lm's default recipe for Qwen3.5 MoE.
_EIGHT_BIT_MODULE_SUFFIXES = (".mlp.gate", ".mlp.shared_expert_gate")


def is_shifted_norm(arch, name):
    """True for the five zero-centred norm kinds (any naming prefix)."""
    if arch not in QWEN35_ARCHS:
        return False
    return name.endswith(_SHIFTED_NORM_SUFFIXES) or name.endswith(_FINAL_NORM)


def hf_causal_to_disk(arch, name):
    """ForCausalLM state-dict name -> raw HF checkpoint name (architecture.md 3.1/3.3/3.4).

    Real Qwen3.5 checkpoints are the VL wrapper: the text model lives under
    model.language_model.*; qwen2/mistral use model.* directly.
    """
    if arch in QWEN35_ARCHS and name.startswith("model."):
        return "model.language_model." + name[len("model."):]
    return name


def hf_disk_to_causal(arch, name):
    if arch in QWEN35_ARCHS and name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    return name


def _mlx_name(arch, hf_name):
    if arch in QWEN35_ARCHS:
        if hf_name.startswith("model.language_model."):
            return "language_model.model." + hf_name[len("model.language_model."):]
        if hf_name.startswith("lm_head."):
            return "language_model." + hf_name
        raise ValueError(f"unexpected tensor name for {arch}: {hf_name}")
    return hf_name


def _hf_name_from_mlx(arch, mlx_name):
    if arch in QWEN35_ARCHS:
        if mlx_name.startswith("language_model.model."):
            return "model.language_model." + mlx_name[len("language_model.model."):]
        if mlx_name.startswith("language_model.lm_head."):
            return mlx_name[len("language_model."):]
        raise ValueError(f"unexpected MLX tensor name for {arch}: {mlx_name}")
    return mlx_name


def _keeps_f32(name):
    # mlx-lm's cast predicate leaves A_log in its source dtype.
    return name.endswith(".A_log")


def hf_to_mlx(arch, hf, group_size=64, bits=4, tie_word_embeddings=False):
    """Convert raw-HF-named fp32 tensors to the MLX quantized layout.

    hf: dict name -> np.float32 array, names as on disk (hf_causal_to_disk).
    Returns (tensors, quantization) where quantization is the config block.
    Every Linear/Embedding/SwitchLinear weight whose in-dim is a multiple of
    group_size is quantized (embed_tokens and lm_head too); 1-D tensors and
    conv1d stay unquantized in bf16 (A_log in f32).
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch}")
    quant = {"group_size": group_size, "bits": bits, "mode": "affine"}
    dense = {}
    for name, w in hf.items():
        w = np.asarray(w, dtype=np.float32)
        if name.endswith("rotary_emb.inv_freq"):
            continue
        if tie_word_embeddings and name == "lm_head.weight":
            continue
        if name.endswith(".mlp.experts.gate_up_proj"):
            mid = w.shape[-2] // 2
            base = name[: -len("experts.gate_up_proj")] + "switch_mlp."
            dense[base + "gate_proj.weight"] = w[..., :mid, :]
            dense[base + "up_proj.weight"] = w[..., mid:, :]
            continue
        if name.endswith(".mlp.experts.down_proj"):
            dense[name[: -len("experts.down_proj")] + "switch_mlp.down_proj.weight"] = w
            continue
        if name.endswith("conv1d.weight"):
            if w.ndim != 3 or w.shape[1] != 1:
                raise ValueError(f"{name}: expected HF conv1d [C,1,K], got {w.shape}")
            w = np.ascontiguousarray(np.moveaxis(w, 2, 1))  # [C,1,K] -> [C,K,1]
        if is_shifted_norm(arch, name):
            w = 1.0 + w  # rounded to bf16 below, as mlx-lm's sanitize does in bf16
        dense[name] = w

    out = {}
    for name, w in dense.items():
        mname = _mlx_name(arch, name)
        quantizable = (name.endswith(".weight") and w.ndim >= 2 and "conv1d" not in name
                       and w.shape[-1] % group_size == 0)
        if quantizable:
            module = mname[: -len(".weight")]
            b = bits
            if arch == "qwen3_5_moe" and module.endswith(_EIGHT_BIT_MODULE_SUFFIXES):
                b = 8
                quant[module] = {"group_size": group_size, "bits": 8}
            wq, s, bi = quantize(w, group_size, b)
            out[module + ".weight"] = wq
            out[module + ".scales"] = s
            out[module + ".biases"] = bi
        elif _keeps_f32(name):
            out[mname] = w.astype(np.float32)
        else:
            out[mname] = BF16(f32_to_bf16_bits(w))
    return out, quant


def _bits_for(quant, module):
    o = quant.get(module)
    if isinstance(o, dict):
        return o.get("group_size", quant["group_size"]), o.get("bits", quant["bits"])
    return quant["group_size"], quant["bits"]


def mlx_to_hf(arch, mlx, quant):
    """Inverse of hf_to_mlx: dequantize, undo +1, conv back to [C,1,K], re-fuse MoE.

    Returns raw-HF-named fp32 tensors (the function the MLX file computes).
    """
    dense = {}
    for name, t in mlx.items():
        if name.endswith(".scales") or name.endswith(".biases"):
            continue
        if name.endswith(".weight") and (name[: -len(".weight")] + ".scales") in mlx:
            module = name[: -len(".weight")]
            gs, b = _bits_for(quant, module)
            w = dequantize(t, mlx[module + ".scales"], mlx[module + ".biases"], gs, b)
        else:
            w = as_f32(t).copy()
        dense[_hf_name_from_mlx(arch, name)] = w
    hf = {}
    experts = {}
    for name, w in dense.items():
        if ".mlp.switch_mlp." in name:
            prefix, rest = name.split(".mlp.switch_mlp.")
            experts.setdefault(prefix, {})[rest] = w
            continue
        if name.endswith("conv1d.weight"):
            w = np.ascontiguousarray(np.moveaxis(w, 1, 2))
        if is_shifted_norm(arch, name):
            w = (w - 1.0).astype(np.float32)
        hf[name] = w
    for prefix, e in experts.items():
        hf[prefix + ".mlp.experts.gate_up_proj"] = np.concatenate(
            [e["gate_proj.weight"], e["up_proj.weight"]], axis=-2)
        hf[prefix + ".mlp.experts.down_proj"] = e["down_proj.weight"]
    return hf


def bf16_exact_for_mlx(arch, hf):
    """Round the tensors MLX stores unquantized so both layouts agree exactly.

    Norms of the zero-centred kind become w = bf16(1+w) - 1 (so bf16(1+w) is
    exact); other 1-D tensors and conv1d become bf16 values; A_log stays f32.
    Quantized weights are left alone (they are replaced by their dequantized
    values by the caller).
    """
    out = {}
    for name, w in hf.items():
        w = np.asarray(w, dtype=np.float32)
        if is_shifted_norm(arch, name):
            w = (bf16_round(1.0 + w) - 1.0).astype(np.float32)
        elif _keeps_f32(name):
            pass
        elif w.ndim == 1 or "conv1d" in name:
            w = bf16_round(w)
        out[name] = w
    return out


def mlx_text_config(arch, hf_text_cfg, quant, extra_top=None):
    """config.json for the MLX layout: mlx-lm keeps text_config nested for
    qwen3_5*, drops vision_config, and writes quantization (and its duplicate
    quantization_config) at the top level."""
    if arch in QWEN35_ARCHS:
        cfg = {
            "model_type": arch,
            "architectures": ["Qwen3_5ForConditionalGeneration" if arch == "qwen3_5"
                              else "Qwen3_5MoeForConditionalGeneration"],
            "text_config": hf_text_cfg,
            "tie_word_embeddings": hf_text_cfg.get("tie_word_embeddings", False),
        }
    else:
        cfg = dict(hf_text_cfg)
    if extra_top:
        cfg.update(extra_top)
    cfg["quantization"] = quant
    cfg["quantization_config"] = quant
    return cfg
