"""Self-checks for mlx_convert (numpy only): python3 tools/python/test_mlx_convert.py"""
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mlx_convert as mc  # noqa: E402

passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what)


rng = np.random.default_rng(0)

# bf16 rounding: exact values survive, ties go to even
x = np.array([1.0, -2.5, 3.140625, 1.00390625, 1.01171875], dtype=np.float32)
r = mc.bf16_round(x)
check(r[0] == 1.0 and r[1] == -2.5 and r[2] == 3.140625, "bf16 exact values")
check(r[3] == 1.0, "bf16 tie rounds to even (down)")
check(r[4] == 1.015625, "bf16 tie rounds to even (up)")

# pack / unpack LSB-first
q = np.arange(16, dtype=np.uint32).reshape(1, 16) % 16
p = mc.pack(q, 4)
check(p.shape == (1, 2) and p[0, 0] == 0x76543210, "4-bit pack LSB-first")
check((mc.unpack(p, 4, 16) == q).all(), "4-bit unpack")
q8 = np.array([[1, 2, 3, 250]], dtype=np.uint32)
check(mc.pack(q8, 8)[0, 0] == (250 << 24 | 3 << 16 | 2 << 8 | 1), "8-bit pack")

# quantize: error bounded by half a step, zero exactly representable
for bits in (4, 8):
    w = rng.normal(0, 0.1, size=(3, 32, 128)).astype(np.float32)
    w[0, 0, :64] = 0.0
    wq, s, b = mc.quantize(w, 64, bits)
    check(wq.shape == (3, 32, 128 * bits // 32), f"packed shape {bits}")
    check(s.shape == (3, 32, 2), f"scales shape {bits}")
    d = mc.dequantize(wq, s, b, 64, bits)
    step = np.abs(s.to_f32()).max()
    err = np.abs(d - w).max()
    # Anchoring the grid on the larger edge (s = edge/q0) can stretch the other
    # end past the top code, so the bound is one step, not half a step.
    # At 8 bits the bf16 rounding of scale (x255) and bias adds up to about one more step.
    check(err <= step * (1.001 if bits == 4 else 2.0), f"{bits}-bit error {err} vs step {step}")
    check(np.all(d[0, 0, :64] == 0.0), f"{bits}-bit all-zero group dequantizes to 0")
    # the larger-magnitude edge of every group is reproduced up to bf16 rounding of scale/bias
    g = w.reshape(3, 32, 2, 64)
    gd = d.reshape(3, 32, 2, 64)
    big = np.where(np.abs(g.min(-1)) > np.abs(g.max(-1)), g.min(-1), g.max(-1))
    bigd = np.where(np.abs(g.min(-1)) > np.abs(g.max(-1)), gd.min(-1), gd.max(-1))
    check(np.abs(big - bigd).max() <= 0.02 * np.abs(big).max(), f"{bits}-bit edge kept")

# safetensors round trip, incl. BF16 and U32
with tempfile.TemporaryDirectory() as td:
    path = os.path.join(td, "t.safetensors")
    t = {"a": rng.normal(size=(2, 3)).astype(np.float32), "b": mc.BF16(mc.f32_to_bf16_bits(np.ones(5, np.float32))),
         "c": np.arange(6, dtype=np.uint32).reshape(3, 2), "d": np.array([7], dtype=np.int32)}
    mc.save_safetensors(path, t, {"format": "mlx"})
    back, meta = mc.load_safetensors(path)
    check(meta == {"format": "mlx"}, "metadata")
    check(np.array_equal(back["a"], t["a"]) and np.array_equal(back["c"], t["c"]), "f32/u32 roundtrip")
    check(isinstance(back["b"], mc.BF16) and np.all(back["b"].to_f32() == 1.0), "bf16 roundtrip")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
    check(n % 8 == 0, "header padded to 8 bytes")

# layout round trip for a tiny qwen3_5_moe-like state dict
H, E, I, V = 64, 4, 64, 128
hf = {
    "model.language_model.embed_tokens.weight": rng.normal(size=(V, H)),
    "model.language_model.norm.weight": rng.normal(0, 0.1, size=H),
    "lm_head.weight": rng.normal(size=(V, H)),
    "model.language_model.layers.0.input_layernorm.weight": rng.normal(0, 0.1, size=H),
    "model.language_model.layers.0.linear_attn.conv1d.weight": rng.normal(size=(32, 1, 4)),
    "model.language_model.layers.0.linear_attn.A_log": rng.normal(size=4),
    "model.language_model.layers.0.linear_attn.norm.weight": 1 + rng.normal(0, 0.1, size=16),
    "model.language_model.layers.0.mlp.gate.weight": rng.normal(size=(E, H)),
    "model.language_model.layers.0.mlp.shared_expert_gate.weight": rng.normal(size=(1, H)),
    "model.language_model.layers.0.mlp.experts.gate_up_proj": rng.normal(size=(E, 2 * I, H)),
    "model.language_model.layers.0.mlp.experts.down_proj": rng.normal(size=(E, H, I)),
    "model.language_model.layers.0.self_attn.q_norm.weight": rng.normal(0, 0.1, size=64),
}
hf = {k: np.asarray(v, np.float32) for k, v in hf.items()}
hf = mc.bf16_exact_for_mlx("qwen3_5_moe", hf)
mlx, quant = mc.hf_to_mlx("qwen3_5_moe", hf)
check("language_model.model.layers.0.mlp.switch_mlp.gate_proj.weight" in mlx, "switch_mlp split")
check(mlx["language_model.model.layers.0.mlp.switch_mlp.gate_proj.weight"].shape == (E, I, H // 8), "switch shape")
check(mlx["language_model.model.layers.0.linear_attn.conv1d.weight"].shape == (32, 4, 1), "conv [C,K,1]")
check(quant.get("language_model.model.layers.0.mlp.gate") == {"group_size": 64, "bits": 8}, "router 8-bit")
check(quant.get("language_model.model.layers.0.mlp.shared_expert_gate") == {"group_size": 64, "bits": 8},
      "shared gate 8-bit")
check(mlx["language_model.model.layers.0.mlp.gate.weight"].shape == (E, H // 4), "8-bit packed shape")
check(mlx["language_model.model.layers.0.linear_attn.A_log"].dtype == np.float32, "A_log f32")
check(isinstance(mlx["language_model.model.norm.weight"], mc.BF16), "norm bf16")
nw = mlx["language_model.model.norm.weight"].to_f32()
check(np.array_equal(nw, 1 + hf["model.language_model.norm.weight"]), "norm stored as exact 1+w")
check(np.array_equal(mlx["language_model.model.layers.0.linear_attn.norm.weight"].to_f32(),
                     hf["model.language_model.layers.0.linear_attn.norm.weight"]), "gated norm not shifted")
back = mc.mlx_to_hf("qwen3_5_moe", mlx, quant)
check(set(back) == set(hf), f"round-trip names {set(back) ^ set(hf)}")
for k in hf:
    if k in back and hf[k].ndim == 1 or "conv1d" in k:
        check(np.array_equal(back[k], hf[k]), f"exact unquantized {k}")
gu = back["model.language_model.layers.0.mlp.experts.gate_up_proj"]
check(gu.shape == (E, 2 * I, H) and np.abs(gu - hf["model.language_model.layers.0.mlp.experts.gate_up_proj"]).max() < 0.5,
      "gate_up refused")
# the dequantized MoE halves are exactly the dequantized switch_mlp tensors
sw = mc.dequantize(mlx["language_model.model.layers.0.mlp.switch_mlp.up_proj.weight"],
                   mlx["language_model.model.layers.0.mlp.switch_mlp.up_proj.scales"],
                   mlx["language_model.model.layers.0.mlp.switch_mlp.up_proj.biases"])
check(np.array_equal(gu[:, I:, :], sw), "up half of gate_up == switch_mlp.up_proj")

# qwen2: tied lm_head dropped, bias kept unquantized next to weight/scales/biases
q2 = {"model.embed_tokens.weight": rng.normal(size=(V, H)).astype(np.float32),
      "lm_head.weight": rng.normal(size=(V, H)).astype(np.float32),
      "model.layers.0.self_attn.q_proj.weight": rng.normal(size=(H, H)).astype(np.float32),
      "model.layers.0.self_attn.q_proj.bias": rng.normal(size=H).astype(np.float32)}
m2, _ = mc.hf_to_mlx("qwen2", q2, tie_word_embeddings=True)
check("lm_head.weight" not in m2, "tied lm_head dropped")
check({"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.scales",
       "model.layers.0.self_attn.q_proj.biases", "model.layers.0.self_attn.q_proj.bias"} <= set(m2), "qwen2 bias trap")

# committed fixtures: the MLX file dequantizes bit-exactly to the HF file
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures")
import json  # noqa: E402
for arch in mc.ARCHS:
    d = os.path.join(root, arch)
    if not os.path.isdir(d):
        continue
    m, meta = mc.load_safetensors(os.path.join(d, "mlx", "model.safetensors"))
    h, _ = mc.load_safetensors(os.path.join(d, "hf", "model.safetensors"))
    with open(os.path.join(d, "mlx", "config.json")) as f:
        q = json.load(f)["quantization"]
    back = mc.mlx_to_hf(arch, m, q)
    check(meta.get("format") == "mlx", f"{arch}: mlx metadata")
    check(set(back) == set(h) and all(np.array_equal(back[k], h[k]) for k in h), f"{arch}: MLX == HF weights")
    ref, _ = mc.load_safetensors(os.path.join(d, "reference.safetensors"))
    for i in range(4):
        check((ref[f"cont_logits_{i}"].argmax(-1) == ref[f"greedy_{i}"]).all() and ref[f"margin_{i}"].min() >= 0.05,
              f"{arch}: greedy/margins {i}")

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
