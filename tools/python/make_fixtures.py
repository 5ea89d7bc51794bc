#!/usr/bin/env python3
"""Reference fixtures for the C engine: tiny random models of the four
architectures, in MLX 4-bit layout and raw Hugging Face layout, with logits
and greedy continuations computed by transformers (fp32, CPU) on the
DEQUANTIZED weights, so the reference is exactly the function the MLX file
encodes.

Runs on the GPU box (torch + transformers there). Usage:
    python3 tools/python/make_fixtures.py [--out tests/fixtures] [--arch qwen3_5 ...] [--smoke]

Layout written per arch (the format agreed with the model helper):
    <out>/<arch>/mlx/{config.json,model.safetensors}
    <out>/<arch>/hf/{config.json,model.safetensors}
    <out>/<arch>/reference.safetensors   prompt_i I32[L], logits_i F32[L,V], greedy_i I32[16],
                                         margin_i F32[16], cont_logits_i F32[16,V]
    <out>/<arch>/meta.json
"""

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mlx_convert as mc  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

GREEDY_STEPS = 16
MIN_MARGIN = 0.05
MAX_ATTEMPTS = 40

SPECS = {
    "qwen3_5": {
        "config_cls": "Qwen3_5TextConfig",
        "model_cls": "Qwen3_5ForCausalLM",
        "hf_arch": "Qwen3_5ForConditionalGeneration",
        "cfg": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
                    linear_value_head_dim=64, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
                    tie_word_embeddings=False, max_position_embeddings=4096, hidden_act="silu",
                    attention_bias=False,
                    layer_types=["linear_attention"] * 3 + ["full_attention"]
                    + ["linear_attention"] * 3 + ["full_attention"],
                    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                     "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                                     "mrope_interleaved": True}),
    },
    "qwen3_5_moe": {
        "config_cls": "Qwen3_5MoeTextConfig",
        "model_cls": "Qwen3_5MoeForCausalLM",
        "hf_arch": "Qwen3_5MoeForConditionalGeneration",
        "cfg": dict(vocab_size=512, hidden_size=64, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
                    linear_value_head_dim=64, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
                    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                    shared_expert_intermediate_size=64,
                    tie_word_embeddings=False, max_position_embeddings=4096, hidden_act="silu",
                    attention_bias=False,
                    layer_types=["linear_attention"] * 3 + ["full_attention"],
                    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                     "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                                     "mrope_interleaved": True}),
    },
    "qwen2": {
        "config_cls": "Qwen2Config",
        "model_cls": "Qwen2ForCausalLM",
        "hf_arch": "Qwen2ForCausalLM",
        # max_position_embeddings = factor * original so transformers' YaRN and
        # mlx-lm's agree whichever of the two they take the factor from.
        "cfg": dict(vocab_size=512, hidden_size=128, intermediate_size=128, num_hidden_layers=4,
                    num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-6,
                    tie_word_embeddings=True, max_position_embeddings=128, hidden_act="silu",
                    use_sliding_window=False,
                    rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                                     "original_max_position_embeddings": 32}),
        "legacy_rope": {"rope_theta": 1000000.0,
                        "rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": 4.0,
                                         "original_max_position_embeddings": 32}},
    },
    "mistral": {
        "config_cls": "MistralConfig",
        "model_cls": "MistralForCausalLM",
        "hf_arch": "MistralForCausalLM",
        # head_dim 32 while hidden/heads = 16: the engine must honour head_dim.
        "cfg": dict(vocab_size=512, hidden_size=128, intermediate_size=128, num_hidden_layers=4,
                    num_attention_heads=8, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5,
                    tie_word_embeddings=False, max_position_embeddings=4096, hidden_act="silu",
                    sliding_window=None,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000000.0}),
        "legacy_rope": {"rope_theta": 1000000000.0, "rope_scaling": None},
    },
}

PROMPT_LENGTHS = [1, 7, 64, 150]
SMOKE_PROMPT_LENGTHS = [1, 7, 70]


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def make_config(spec):
    cls = getattr(transformers, spec["config_cls"])
    kwargs = dict(spec["cfg"])
    if dataclasses.is_dataclass(cls):
        fields = {f.name for f in dataclasses.fields(cls)}
        dropped = [k for k in kwargs if k not in fields]
        # Extra keys go through __post_init__ kwargs (e.g. partial_rotary_factor);
        # report them so a silently ignored field is visible in the log.
        if dropped:
            log(f"{spec['config_cls']}: non-field kwargs passed through: {dropped}")
    cfg = cls(**kwargs)
    try:
        cfg._attn_implementation = "eager"
    except Exception as e:  # noqa: BLE001
        log("could not force eager attention:", e)
    return cfg


def randomize(model, arch, std, seed):
    """Random init with a larger std than HF's so greedy margins are wide."""
    g = torch.Generator().manual_seed(seed)

    def rn(shape, s):
        return torch.randn(shape, generator=g, dtype=torch.float32) * s

    with torch.no_grad():
        for name, p in model.named_parameters():
            if mc.is_shifted_norm(arch, name):
                p.copy_(rn(p.shape, 0.1))              # zero-centred: effective 1+w
            elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(1.0 + rn(p.shape, 0.1))
            elif name.endswith("A_log"):
                u = torch.rand(p.shape, generator=g) * 15.0 + 1.0
                p.copy_(torch.log(u))
            elif name.endswith("dt_bias"):
                p.copy_(rn(p.shape, 0.5))
            elif "conv1d" in name:
                p.copy_(rn(p.shape, 0.3))
            elif name.endswith(".bias"):
                p.copy_(rn(p.shape, 0.1))
            else:
                p.copy_(rn(p.shape, std))


def state_to_disk_np(arch, model, tied):
    out = {}
    for k, v in model.state_dict().items():
        if k.endswith("rotary_emb.inv_freq") or k.endswith("original_inv_freq"):
            continue
        if tied and k == "lm_head.weight":
            continue
        out[mc.hf_causal_to_disk(arch, k)] = v.detach().to(torch.float32).cpu().numpy().copy()
    return out


def load_disk_np(arch, model, hf_np, tied):
    sd = {mc.hf_disk_to_causal(arch, k): torch.from_numpy(np.ascontiguousarray(v)) for k, v in hf_np.items()}
    if tied:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    res = model.load_state_dict(sd, strict=False)
    missing = [k for k in res.missing_keys if not k.endswith("inv_freq")]
    if missing or res.unexpected_keys:
        raise RuntimeError(f"{arch}: load mismatch: missing={missing} unexpected={res.unexpected_keys}")


def scale_final_norm(arch, hf_np, pow2):
    """Scale logits by 2**pow2 exactly: the final norm's effective weight is
    multiplied by a power of two (exact in bf16 and fp32), which leaves greedy
    tokens unchanged and widens every margin by the same factor."""
    if pow2 == 0:
        return hf_np
    out = dict(hf_np)
    key = mc.hf_causal_to_disk(arch, "model.norm.weight")
    f = np.float32(2.0 ** pow2)
    if mc.is_shifted_norm(arch, key):
        out[key] = (f * (1.0 + hf_np[key]) - 1.0).astype(np.float32)
    else:
        out[key] = (f * hf_np[key]).astype(np.float32)
    return out


class RouterRecorder:
    """Collects top-k expert choices and the k-th vs (k+1)-th router gap."""

    def __init__(self, model, topk):
        self.topk = topk
        self.hooks = []
        self.used = {}
        self.min_gap = float("inf")
        for name, mod in model.named_modules():
            if name.endswith(".mlp.gate"):
                self.hooks.append(mod.register_forward_hook(self._hook(name)))

    def _hook(self, name):
        def fn(mod, inp, out):
            logits = out[0] if isinstance(out, tuple) else out
            logits = logits.detach().float().reshape(-1, logits.shape[-1])
            top = torch.topk(logits, self.topk + 1, dim=-1).values
            gap = (top[:, self.topk - 1] - top[:, self.topk]).min().item()
            self.min_gap = min(self.min_gap, gap)
            idx = torch.topk(logits, self.topk, dim=-1).indices
            s = self.used.setdefault(name, set())
            s.update(idx.flatten().tolist())
        return fn

    def remove(self):
        for h in self.hooks:
            h.remove()


@torch.no_grad()
def run_reference(model, prompts):
    """Logits at every prompt position, greedy continuation via generate(),
    and margins from a no-cache forward over prompt + continuation."""
    res = []
    for ids in prompts:
        x = torch.tensor(ids, dtype=torch.long)[None]
        logits = model(input_ids=x, use_cache=False).logits[0].float()
        gen = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=GREEDY_STEPS,
                             min_new_tokens=GREEDY_STEPS, do_sample=False, use_cache=True,
                             pad_token_id=0, eos_token_id=None)
        greedy = gen[0, x.shape[1]:].tolist()
        if len(greedy) != GREEDY_STEPS:
            raise RuntimeError(f"generate returned {len(greedy)} tokens")
        full = torch.cat([x, torch.tensor(greedy[:-1], dtype=torch.long)[None]], dim=1)
        fl = model(input_ids=full, use_cache=False).logits[0].float()
        cont = fl[x.shape[1] - 1:]
        top2 = torch.topk(cont, 2, dim=-1)
        margins = (top2.values[:, 0] - top2.values[:, 1]).numpy()
        argmax = top2.indices[:, 0].tolist()
        res.append({"logits": logits.numpy(), "greedy": greedy, "margins": margins,
                    "nocache_argmax": argmax, "cont_logits": cont.numpy()})
    return res


def hf_config_dict(arch, spec, cfg, dtype, for_mlx=False):
    d = cfg.to_dict()
    for k in list(d):
        if k.startswith("_"):
            d.pop(k)
    d["dtype"] = dtype
    d.pop("torch_dtype", None)
    if arch in mc.QWEN35_ARCHS:
        if for_mlx:
            d["full_attention_interval"] = 4  # mlx-lm reads only this; HF reads layer_types
        return d
    d["architectures"] = [spec["hf_arch"]]
    return d


def wrap_qwen35(arch, spec, text_cfg):
    return {"model_type": arch, "architectures": [spec["hf_arch"]], "text_config": text_cfg,
            "tie_word_embeddings": text_cfg.get("tie_word_embeddings", False),
            "transformers_version": transformers.__version__}


def rope_info(model):
    rot = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rot is None:
        return None
    return {"inv_freq": [float(v) for v in rot.inv_freq.float().cpu().tolist()],
            "attention_scaling": float(getattr(rot, "attention_scaling", 1.0))}


def build_one(arch, out_root, seed0, std, smoke):
    spec = SPECS[arch]
    cfg = make_config(spec)
    model_cls = getattr(transformers, spec["model_cls"])
    tied = bool(spec["cfg"].get("tie_word_embeddings"))
    V = spec["cfg"]["vocab_size"]
    lengths = SMOKE_PROMPT_LENGTHS if smoke else PROMPT_LENGTHS
    prng = np.random.default_rng(1234)
    prompts = [prng.integers(0, V, size=n).astype(np.int64).tolist() for n in lengths]
    is_moe = arch == "qwen3_5_moe"

    chosen = None
    attempts = 1 if smoke else MAX_ATTEMPTS
    for attempt in range(attempts):
        seed = seed0 + attempt
        torch.manual_seed(seed)
        model = model_cls(cfg).float().eval()
        randomize(model, arch, std, seed)
        raw = state_to_disk_np(arch, model, tied)
        raw = mc.bf16_exact_for_mlx(arch, raw)
        mlx, quant = mc.hf_to_mlx(arch, raw, tie_word_embeddings=tied)
        hf_np = mc.mlx_to_hf(arch, mlx, quant)
        load_disk_np(arch, model, hf_np, tied)
        rec = RouterRecorder(model, spec["cfg"].get("num_experts_per_tok", 0)) if is_moe else None
        ref = run_reference(model, prompts)
        if rec:
            rec.remove()
        m = float(min(r["margins"].min() for r in ref))
        consistent = all(r["greedy"] == r["nocache_argmax"] for r in ref)
        why = []
        if not consistent:
            why.append("cache/no-cache greedy differ")
        if m <= 0:
            why.append("tie")
        pow2 = 0 if m <= 0 else max(0, math.ceil(math.log2(MIN_MARGIN / m)))
        if pow2 > 4:
            why.append(f"margin {m:.4g} needs x2^{pow2}")
        if is_moe:
            E = spec["cfg"]["num_experts"]
            if any(len(s) != E for s in rec.used.values()) or len(rec.used) != spec["cfg"]["num_hidden_layers"]:
                why.append("not every expert used: " + str({k: len(v) for k, v in rec.used.items()}))
            if rec.min_gap < 1e-3:
                why.append(f"router near-tie {rec.min_gap:.2e}")
        log(f"{arch} attempt {attempt} seed {seed}: min margin {m:.4f} pow2 {pow2} {'OK' if not why else why}")
        if why and not smoke:
            continue
        chosen = (seed, pow2)
        break
    if chosen is None:
        raise RuntimeError(f"{arch}: no seed met the margin/router criteria in {attempts} attempts")
    seed, pow2 = chosen

    # Final model: the chosen seed with logits scaled by 2**pow2, re-derived
    # from scratch so every file comes from the same tensors.
    torch.manual_seed(seed)
    model = model_cls(cfg).float().eval()
    randomize(model, arch, std, seed)
    raw = mc.bf16_exact_for_mlx(arch, state_to_disk_np(arch, model, tied))
    raw = scale_final_norm(arch, raw, pow2)
    mlx, quant = mc.hf_to_mlx(arch, raw, tie_word_embeddings=tied)
    hf_np = mc.mlx_to_hf(arch, mlx, quant)
    load_disk_np(arch, model, hf_np, tied)
    rec = RouterRecorder(model, spec["cfg"].get("num_experts_per_tok", 0)) if is_moe else None
    ref = run_reference(model, prompts)
    if rec:
        rec.remove()
    min_margin = float(min(r["margins"].min() for r in ref))
    if not smoke and min_margin < MIN_MARGIN:
        raise RuntimeError(f"{arch}: final min margin {min_margin} < {MIN_MARGIN}")
    for r in ref:
        if r["greedy"] != r["nocache_argmax"]:
            raise RuntimeError(f"{arch}: generate() and no-cache argmax disagree")

    d = os.path.join(out_root, arch)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(os.path.join(d, "mlx"))
    os.makedirs(os.path.join(d, "hf"))

    # MLX layout
    mc.save_safetensors(os.path.join(d, "mlx", "model.safetensors"), mlx, {"format": "mlx"})
    text_mlx = hf_config_dict(arch, spec, cfg, "bfloat16", for_mlx=True)
    if arch in mc.QWEN35_ARCHS:
        mlx_cfg = mc.mlx_text_config(arch, text_mlx, quant)
    else:
        mlx_cfg = mc.mlx_text_config(arch, text_mlx, quant, extra_top=spec.get("legacy_rope"))
    with open(os.path.join(d, "mlx", "config.json"), "w") as f:
        json.dump(mlx_cfg, f, indent=2, sort_keys=True)

    # HF layout: dequantized weights as F32
    mc.save_safetensors(os.path.join(d, "hf", "model.safetensors"),
                        {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in hf_np.items()},
                        {"format": "pt"})
    text_hf = hf_config_dict(arch, spec, cfg, "float32")
    hf_cfg = wrap_qwen35(arch, spec, text_hf) if arch in mc.QWEN35_ARCHS else text_hf
    with open(os.path.join(d, "hf", "config.json"), "w") as f:
        json.dump(hf_cfg, f, indent=2, sort_keys=True)

    # Reference outputs
    reft = {}
    for i, (ids, r) in enumerate(zip(prompts, ref)):
        reft[f"prompt_{i}"] = np.asarray(ids, dtype=np.int32)
        reft[f"logits_{i}"] = np.ascontiguousarray(r["logits"], dtype=np.float32)
        reft[f"greedy_{i}"] = np.asarray(r["greedy"], dtype=np.int32)
        reft[f"margin_{i}"] = np.asarray(r["margins"], dtype=np.float32)
        reft[f"cont_logits_{i}"] = np.ascontiguousarray(r["cont_logits"], dtype=np.float32)
    mc.save_safetensors(os.path.join(d, "reference.safetensors"), reft, {"format": "pt"})

    checks = verify_files(arch, d, model_cls, model, prompts, ref, tied)

    max_logit = float(max(np.abs(r["logits"]).max() for r in ref))
    meta = {
        "arch": arch,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "seed": seed,
        "init_std": std,
        "logit_scale": 2 ** pow2,
        "logit_scale_note": "final norm effective weight multiplied by this power of two (exact) to widen margins",
        "dims": {k: v for k, v in spec["cfg"].items() if not isinstance(v, dict)},
        "rope_parameters": spec["cfg"].get("rope_parameters"),
        "rope": rope_info(model),
        "quantization": {"group_size": 64, "bits": 4, "mode": "affine",
                         "eight_bit_modules": sorted(k for k in quant if isinstance(quant[k], dict))},
        "prompts": [{"index": i, "length": len(p)} for i, p in enumerate(prompts)],
        "greedy_steps": GREEDY_STEPS,
        "min_margin": min_margin,
        "max_abs_logit": max_logit,
        "tolerance": {
            "logits_atol": 2e-3 * max(1.0, max_logit),
            "logits_rtol": 0.0,
            "greedy": "exact",
            "note": "transformers fp32 on CPU, eager attention, GDN via the torch chunked (prefill) and "
                    "recurrent (decode) reference; logits compared with atol = 2e-3 * max(1, max|logit|)",
        },
        "reference_device": "cpu",
        "reference_dtype": "float32",
        "checks": checks,
    }
    if is_moe:
        meta["expert_usage"] = {k: len(v) for k, v in rec.used.items()}
        meta["min_router_gap"] = rec.min_gap
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
    sizes = {os.path.relpath(os.path.join(dp, fn), d): os.path.getsize(os.path.join(dp, fn))
             for dp, _, fns in os.walk(d) for fn in fns}
    log(f"{arch}: wrote {d} total {sum(sizes.values()) / 1e6:.2f} MB; min margin {min_margin:.4f}; checks {checks}")
    return meta


@torch.no_grad()
def verify_files(arch, d, model_cls, model, prompts, ref, tied):
    """Re-read what was written and prove both layouts are the same function."""
    checks = {}
    mlx, meta = mc.load_safetensors(os.path.join(d, "mlx", "model.safetensors"))
    with open(os.path.join(d, "mlx", "config.json")) as f:
        quant = json.load(f)["quantization"]
    hf_from_mlx = mc.mlx_to_hf(arch, mlx, quant)
    hf, _ = mc.load_safetensors(os.path.join(d, "hf", "model.safetensors"))
    if set(hf_from_mlx) != set(hf):
        raise RuntimeError(f"{arch}: MLX->HF names differ: {set(hf_from_mlx) ^ set(hf)}")
    worst = max(float(np.abs(hf_from_mlx[k] - hf[k]).max()) for k in hf)
    if worst != 0.0:
        raise RuntimeError(f"{arch}: MLX file dequantizes to different weights (max diff {worst})")
    checks["mlx_dequant_equals_hf"] = True

    # Load the HF directory the way a user would; report newly initialized weights.
    try:
        m2, info = model_cls.from_pretrained(os.path.join(d, "hf"), output_loading_info=True,
                                             dtype=torch.float32)
        m2 = m2.float().eval()
        missing = [k for k in info.get("missing_keys", []) if "inv_freq" not in k]
        checks["from_pretrained_missing_keys"] = sorted(missing)
        checks["from_pretrained_unexpected_keys"] = sorted(info.get("unexpected_keys", []))
        x = torch.tensor(prompts[-1], dtype=torch.long)[None]
        l2 = m2(input_ids=x, use_cache=False).logits[0].float().numpy()
        checks["from_pretrained_max_abs_diff"] = float(np.abs(l2 - ref[-1]["logits"]).max())
        if missing:
            log(f"{arch}: WARNING from_pretrained left weights newly initialized: {missing}")
    except Exception as e:  # noqa: BLE001
        checks["from_pretrained_error"] = f"{type(e).__name__}: {e}"[:500]
        log(f"{arch}: from_pretrained check failed: {e}")

    # fp64 run as a yardstick for the inherent fp32 error of the reference.
    try:
        m64 = model.to(torch.float64)
        x = torch.tensor(prompts[-1], dtype=torch.long)[None]
        l64 = m64(input_ids=x, use_cache=False).logits[0].double().numpy()
        checks["fp32_vs_fp64_max_abs_diff"] = float(np.abs(l64 - ref[-1]["logits"]).max())
    except Exception as e:  # noqa: BLE001
        checks["fp64_error"] = f"{type(e).__name__}: {e}"[:300]
    finally:
        model.to(torch.float32)
    return checks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures")
    ap.add_argument("--arch", nargs="*", default=list(SPECS))
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--std", type=float, default=0.12)
    ap.add_argument("--smoke", action="store_true", help="one attempt per arch, short prompts")
    args = ap.parse_args()
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    log("transformers", transformers.__version__, "torch", torch.__version__)
    for a in args.arch:
        s = SPECS[a]
        log(a, "config", s["config_cls"], hasattr(transformers, s["config_cls"]),
            "model", s["model_cls"], hasattr(transformers, s["model_cls"]))
    os.makedirs(args.out, exist_ok=True)
    failed = []
    for a in args.arch:
        t0 = time.time()
        try:
            build_one(a, args.out, args.seed, args.std, args.smoke)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            failed.append(a)
        log(f"{a}: {time.time() - t0:.1f}s")
    log("failed:", failed or "none")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
