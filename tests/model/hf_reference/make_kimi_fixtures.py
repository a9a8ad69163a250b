#!/usr/bin/env python3
"""Independent reference fixtures for Strider's Kimi Linear import (tests/model/hf_reference).

Small random Kimi Linear checkpoints made with the `kimi_linear` model of Hugging Face
transformers, written in the published on-disk layout (config.json shaped like
Kimi-Linear-48B-A3B's, the published tensor names, *.safetensors and, for the sharded one,
model.safetensors.index.json), and the per-token log-probs of fixed token sequences under each.
The C++ suite (tests/model/hf_reference_test.cc) reads only the files this writes; it needs no
Python.

Pinned versions (the reference was made with exactly these; `generate` refuses others):
    python 3.11, torch==2.11.0 (run on the CPU), transformers==5.25.0, safetensors==0.8.0,
    numpy==2.4.6
Set up, offline apart from the package index:
    python3.11 -m venv /tmp/kimivenv
    /tmp/kimivenv/bin/pip install torch==2.11.0 transformers==5.25.0 safetensors==0.8.0 numpy==2.4.6
Run (nothing is fetched from a model hub: HF_HUB_OFFLINE is set below):
    /tmp/kimivenv/bin/python tests/model/hf_reference/make_kimi_fixtures.py generate
        rewrites tests/model/hf_reference/<fixture>/ and expected.json.
    /tmp/kimivenv/bin/python tests/model/hf_reference/make_kimi_fixtures.py check-export \
        --fixture NAME --dir EXPORTED
        loads a directory written by `strider model export --to-hf` with transformers and checks
        its log-probs against expected.json (and its tensors bit for bit against the fixture's).
    /tmp/kimivenv/bin/python tests/model/hf_reference/make_kimi_fixtures.py dump \
        --fixture NAME [--sequence I] [--out FILE.json]
        the reference's activations after every sublayer, to find where another implementation
        departs from it.

What `generate` does, per fixture:
 1. Builds the config (the published config.json with the fixture's shapes) and a
    KimiLinearForCausalLM from it, draws every weight from a seeded generator with a scale that
    keeps the model far from uniform, and saves it with save_pretrained. The tensor names
    save_pretrained writes are checked against the published checkpoint's names (the same list
    as common/model/hf_kimi_linear.cc's table). In transformers 5.25 they agree but for the
    dense layers' MLP, which save_pretrained writes as `block_sparse_moe.{gate,up,down}_proj`
    where the published checkpoint (and vLLM) has `mlp.{gate,up,down}_proj`: renamed here.
 2. Rounds the tensors to the fixture's storage dtype (bfloat16 for one, with A_log, dt_bias and
    the router's e_score_correction_bias kept in float32 as the published checkpoint stores
    them) and writes the checkpoint itself: one model.safetensors, or shards with an index.
 3. Computes log p(token[t+1] | token[..t]) in float64 from the stored weights (upcast) with the
    equations of transformers' kimi_linear written out below (the delta rule token by token).
    transformers itself casts to float32 inside its norms, router and KDA kernels, so it is run
    too, in float32 from the same files, and must agree within 2e-5.
 4. Draws token sequences from the ids other than the checkpoint's bos, eos and pad
    (vocabularies are at least 288, the byte tokenizer's, which Strider's configs require); the
    longest sequence of each fixture holds 268, Strider's image-patch placeholder, which a
    text-only model must read as an ordinary token.
    Keeps a token sequence only if every routing decision has a clear margin in the float64
    reference: the gap between the k-th and (k+1)-th selection score, and between the
    topk_group-th and next group score, exceeds 1e-3 at every token of every MoE layer, so
    float32 implementations choose the same experts. Sequences are redrawn until they do.

Where the published implementations differ (documented in docs/model_math.md), the fixtures
follow transformers: kv_a_layernorm and q_a_layernorm use epsilon 1e-6 (vLLM: rms_norm_eps), the
gated output norm uses rms_norm_eps (vLLM: 1e-5; the fixtures use rms_norm_eps 1e-5, so both
agree), and the renormalised routing weights divide by sum + 1e-20. expected.json records how
far the log-probs move under the vLLM choice of the latent norms' epsilon.
"""

import argparse
import datetime
import json
import math
import os
import pathlib
import re
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import numpy as np  # noqa: E402
import safetensors  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import KimiLinearConfig, KimiLinearForCausalLM  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[2]
PUBLISHED_CONFIG = REPO / "tests/model/fixtures/kimi_linear_48b_a3b/config.json"
PINNED = {"torch": "2.11.0", "transformers": "5.25.0", "safetensors": "0.8.0", "numpy": "2.4.6"}
ROUTING_MARGIN = 1e-3
TRANSFORMERS_TOLERANCE = 2e-5
STRIDER_IMAGE_PATCH = 268  # common/token_ids.h
LATENT_NORM_EPS = 1e-6  # transformers' KimiLinearRMSNorm default, used by q/kv_a_layernorm

# Each fixture: its shapes (config.json fields), how it is stored, and its seeds. All are hybrid
# (KDA and MLA layers), start with dense layers and route to several of several experts.
FIXTURES = [
    {
        "name": "kimi_full_query_f32",
        "about": "float32, one file; MLA with q_lora_rank null (as published), value heads as "
                 "wide as the key's nope part; ungrouped top-2 of 8 experts, 1 shared expert",
        "storage": "float32",
        "shards": 1,
        "seed": 4301,
        "config": {
            "vocab_size": 320, "hidden_size": 32, "num_hidden_layers": 4,
            "intermediate_size": 64, "moe_intermediate_size": 16,
            "num_experts": 8, "num_experts_per_token": 2, "num_shared_experts": 1,
            "first_k_dense_replace": 1, "num_expert_group": 1, "topk_group": 1,
            "routed_scaling_factor": 2.446,
            "num_attention_heads": 2, "num_key_value_heads": 2, "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8, "v_head_dim": 16, "kv_lora_rank": 16, "q_lora_rank": None,
            "linear_attn_config": {"full_attn_layers": [3], "kda_layers": [1, 2, 4],
                                   "head_dim": 16, "num_heads": 2, "short_conv_kernel_size": 4},
        },
        "lengths": [8, 23, 40],
    },
    {
        "name": "kimi_low_rank_query_bf16",
        "about": "bfloat16 with A_log, dt_bias and e_score_correction_bias in float32 (as "
                 "published), one file; MLA with a q_lora_rank and value heads wider than the "
                 "nope part; grouped top-3 of 8 experts in 4 groups (2 groups per token), 2 "
                 "shared experts, 2 dense layers",
        "storage": "bfloat16",
        "shards": 1,
        "seed": 4302,
        "config": {
            "vocab_size": 300, "hidden_size": 48, "num_hidden_layers": 4,
            "intermediate_size": 96, "moe_intermediate_size": 16,
            "num_experts": 8, "num_experts_per_token": 3, "num_shared_experts": 2,
            "first_k_dense_replace": 2, "num_expert_group": 4, "topk_group": 2,
            "routed_scaling_factor": 1.5,
            "num_attention_heads": 3, "num_key_value_heads": 3, "qk_nope_head_dim": 8,
            "qk_rope_head_dim": 4, "v_head_dim": 12, "kv_lora_rank": 12, "q_lora_rank": 16,
            "linear_attn_config": {"full_attn_layers": [2, 4], "kda_layers": [1, 3],
                                   "head_dim": 8, "num_heads": 3, "short_conv_kernel_size": 4},
        },
        "lengths": [9, 24, 37],
    },
    {
        "name": "kimi_sharded_f32",
        "about": "float32 in 3 shards with model.safetensors.index.json; MLA with q_lora_rank "
                 "null and value heads narrower than the nope part; grouped top-2 of 6 experts "
                 "in 3 groups (2 groups per token), 1 shared expert",
        "storage": "float32",
        "shards": 3,
        "seed": 4303,
        "config": {
            "vocab_size": 296, "hidden_size": 32, "num_hidden_layers": 3,
            "intermediate_size": 48, "moe_intermediate_size": 24,
            "num_experts": 6, "num_experts_per_token": 2, "num_shared_experts": 1,
            "first_k_dense_replace": 1, "num_expert_group": 3, "topk_group": 2,
            "routed_scaling_factor": 2.0,
            "num_attention_heads": 4, "num_key_value_heads": 4, "qk_nope_head_dim": 8,
            "qk_rope_head_dim": 4, "v_head_dim": 6, "kv_lora_rank": 10, "q_lora_rank": None,
            "linear_attn_config": {"full_attn_layers": [2], "kda_layers": [1, 3],
                                   "head_dim": 8, "num_heads": 2, "short_conv_kernel_size": 4},
        },
        "lengths": [12, 31, 40],
    },
]

# Stored in float32 whatever the fixture's dtype, as in the published checkpoint.
FLOAT32_SUFFIXES = (".A_log", ".dt_bias", ".e_score_correction_bias")


def fixture_by_name(name):
    for fixture in FIXTURES:
        if fixture["name"] == name:
            return fixture
    sys.exit(f"unknown fixture {name!r}; known: {[f['name'] for f in FIXTURES]}")


def config_json(fixture):
    """The published config.json with the fixture's shapes."""
    published = json.loads(PUBLISHED_CONFIG.read_text())
    config = dict(published)
    config.pop("auto_map", None)  # no modelling code travels with the fixtures
    config.update(fixture["config"])
    vocab = config["vocab_size"]
    config.update({
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": vocab - 1,
        "dtype": fixture["storage"], "head_dim": config["qk_rope_head_dim"],
        "transformers_version": transformers.__version__, "use_grouped_topk": True,
    })
    return config


def layer_kinds(config):
    kda = set(config["linear_attn_config"]["kda_layers"])
    return ["kda" if i + 1 in kda else "mla" for i in range(config["num_hidden_layers"])]


def published_tensor_names(config):
    """The tensor names of a published Kimi Linear checkpoint of this config (the rows of
    common/model/hf_kimi_linear.cc)."""
    names = ["model.embed_tokens.weight"]
    for i, kind in enumerate(layer_kinds(config)):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        a = p + "self_attn."
        if kind == "kda":
            names += [a + n for n in (
                "q_proj.weight", "k_proj.weight", "v_proj.weight", "q_conv1d.weight",
                "k_conv1d.weight", "v_conv1d.weight", "A_log", "f_a_proj.weight",
                "f_b_proj.weight", "dt_bias", "b_proj.weight", "g_a_proj.weight",
                "g_b_proj.weight", "o_norm.weight", "o_proj.weight")]
        else:
            if config["q_lora_rank"]:
                names += [a + "q_a_proj.weight", a + "q_a_layernorm.weight", a + "q_b_proj.weight"]
            else:
                names += [a + "q_proj.weight"]
            names += [a + n for n in ("kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight",
                                      "kv_b_proj.weight", "o_proj.weight")]
        if i < config["first_k_dense_replace"]:
            names += [p + f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")]
        else:
            m = p + "block_sparse_moe."
            names += [m + "gate.weight", m + "gate.e_score_correction_bias"]
            for e in range(config["num_experts"]):
                names += [m + f"experts.{e}.w{n}.weight" for n in (1, 2, 3)]
            if config["num_shared_experts"]:
                names += [m + f"shared_experts.{n}_proj.weight" for n in ("gate", "up", "down")]
    names += ["model.norm.weight"]
    if not config["tie_word_embeddings"]:
        names += ["lm_head.weight"]
    return names


def hf_config(config):
    return KimiLinearConfig(**{k: v for k, v in config.items()
                               if k not in ("architectures", "transformers_version", "dtype")})


# ---------------------------------------------------------------------------------------------
# Weights.

def draw_weights(config, seed):
    """A float32 state dict in the published names, drawn so the model is far from uniform."""
    torch.manual_seed(seed)
    model = KimiLinearForCausalLM(hf_config(config)).float()
    gen = torch.Generator().manual_seed(seed)

    def normal(shape, std):
        return torch.randn(shape, generator=gen, dtype=torch.float64) * std

    def uniform(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=torch.float64)

    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            shape = tensor.shape
            if name.endswith("A_log"):
                value = uniform(shape, 1.0, 16.0).log()
            elif name.endswith("dt_bias"):
                dt = uniform(shape, math.log(1e-3), math.log(1e-1)).exp()
                value = dt + torch.log(-torch.expm1(-dt))  # inverse softplus, as FLA initialises
            elif name.endswith("e_score_correction_bias"):
                value = normal(shape, 0.05)
            elif "norm" in name:  # RMSNorm scales
                value = 1.0 + normal(shape, 0.2)
            elif "conv1d" in name:
                value = normal(shape, 0.5)
            elif name.endswith("embed_tokens.weight"):
                value = normal(shape, 1.0)
            elif name.endswith("lm_head.weight"):
                value = normal(shape, 2.0 / math.sqrt(shape[-1]))
            elif "kv_a_proj_with_mqa" in name or "q_a_proj" in name:
                # Latents well above the norms' epsilon, so 1e-6 against 1e-5 hardly matters.
                value = normal(shape, 4.0 / math.sqrt(shape[-1]))
            elif name.endswith("gate.weight") and "block_sparse_moe" in name or \
                    name.endswith("mlp.gate.weight"):
                value = normal(shape, 2.0 / math.sqrt(shape[-1]))
            elif tensor.dim() == 3 and "experts" in name:  # transformers' fused expert weights
                value = normal(shape, 1.0 / math.sqrt(shape[-1]))
            else:
                value = normal(shape, 1.0 / math.sqrt(shape[-1]))
            tensor.copy_(value.to(tensor.dtype))
    return model


def saved_tensors(model, config):
    """What save_pretrained writes, checked against the published names."""
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True, max_shard_size="1GB")
        tensors = {}
        for path in sorted(pathlib.Path(tmp).glob("*.safetensors")):
            with safe_open(str(path), "pt") as f:
                for key in f.keys():
                    tensors[key] = f.get_tensor(key).clone()
    # save_pretrained reverses its load-time rename block_sparse_moe -> mlp on every layer, the
    # dense ones too; the published checkpoint keeps `mlp.` on its dense layers.
    for i in range(config["first_k_dense_replace"]):
        for part in ("gate", "up", "down"):
            old = f"model.layers.{i}.block_sparse_moe.{part}_proj.weight"
            if old in tensors:
                tensors[f"model.layers.{i}.mlp.{part}_proj.weight"] = tensors.pop(old)
    expected = published_tensor_names(config)
    if sorted(tensors) != sorted(expected):
        missing = sorted(set(expected) - set(tensors))
        extra = sorted(set(tensors) - set(expected))
        raise SystemExit(f"save_pretrained's names differ from the published ones: "
                         f"missing {missing[:8]}, unexpected {extra[:8]}")
    return {name: tensors[name] for name in expected}  # in the published order


def storage_dtype(name, storage):
    if storage == "float32" or name.endswith(FLOAT32_SUFFIXES):
        return torch.float32
    return torch.bfloat16


def write_checkpoint(directory, config, tensors, storage, shards):
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.safetensors*"):
        old.unlink()
    stored = {n: t.to(storage_dtype(n, storage)).contiguous() for n, t in tensors.items()}
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (directory / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": config["vocab_size"] - 1},
        indent=2, sort_keys=True) + "\n")
    if shards == 1:
        save_file(stored, str(directory / "model.safetensors"), metadata={"format": "pt"})
        return stored
    # Whole layers per shard, in order, as the published shards split.
    names = list(stored)
    bounds = np.linspace(0, len(names), shards + 1).round().astype(int)
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: stored[n] for n in names[bounds[s]:bounds[s + 1]]}
        save_file(part, str(directory / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    index = {
        "metadata": {
            "total_parameters": sum(t.numel() for t in stored.values()),
            "total_size": sum(t.numel() * t.element_size() for t in stored.values()),
        },
        "weight_map": dict(sorted(weight_map.items())),
    }
    (directory / "model.safetensors.index.json").write_text(
        json.dumps(index, indent=2) + "\n")
    return stored


def read_checkpoint(directory):
    tensors = {}
    for path in sorted(pathlib.Path(directory).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for key in f.keys():
                tensors[key] = f.get_tensor(key)
    return tensors


# ---------------------------------------------------------------------------------------------
# The float64 reference: transformers 5.25's kimi_linear equations, without its float32 casts.

def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def l2_normalise(x, eps=1e-6):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def linear(x, w):
    return x @ w.T


def causal_conv_silu(x, weight):
    """x [T, C], weight [C, 1, w]: out_t = silu(sum_j weight[:, j] x_{t-w+1+j})."""
    width = weight.shape[-1]
    padded = torch.cat([x.new_zeros(width - 1, x.shape[1]), x], 0)
    out = sum(weight[:, 0, j] * padded[j:j + x.shape[0]] for j in range(width))
    return torch.nn.functional.silu(out)


def kda(W, p, config, x, trace):
    heads = config["linear_attn_config"]["num_heads"]
    dim = config["linear_attn_config"]["head_dim"]
    T = x.shape[0]
    q = causal_conv_silu(linear(x, W[p + "q_proj.weight"]), W[p + "q_conv1d.weight"])
    k = causal_conv_silu(linear(x, W[p + "k_proj.weight"]), W[p + "k_conv1d.weight"])
    v = causal_conv_silu(linear(x, W[p + "v_proj.weight"]), W[p + "v_conv1d.weight"])
    q = l2_normalise(q.view(T, heads, dim)) * dim ** -0.5
    k = l2_normalise(k.view(T, heads, dim))
    v = v.view(T, heads, dim)
    gate_in = linear(linear(x, W[p + "f_a_proj.weight"]), W[p + "f_b_proj.weight"])
    gate_in = (gate_in + W[p + "dt_bias"]).view(T, heads, dim)
    softplus = torch.where(gate_in > 20.0, gate_in, torch.log1p(torch.exp(gate_in)))
    g = -torch.exp(W[p + "A_log"].view(1, heads, 1)) * softplus  # log decay per channel
    beta = torch.sigmoid(linear(x, W[p + "b_proj.weight"]))  # [T, H]
    state = x.new_zeros(heads, dim, dim)  # [H, d_k, d_v]
    outs = []
    for t in range(T):
        state = state * torch.exp(g[t])[:, :, None]
        predicted = torch.einsum("hk,hkv->hv", k[t], state)
        delta = (v[t] - predicted) * beta[t][:, None]
        state = state + k[t][:, :, None] * delta[:, None, :]
        outs.append(torch.einsum("hk,hkv->hv", q[t], state))
    o = torch.stack(outs)  # [T, H, d_v]
    out_gate = linear(linear(x, W[p + "g_a_proj.weight"]), W[p + "g_b_proj.weight"])
    o = rms_norm(o, W[p + "o_norm.weight"], config["rms_norm_eps"])
    o = o * torch.sigmoid(out_gate.view(T, heads, dim))
    trace.update({"kda_q": q, "kda_k": k, "kda_v": v, "kda_log_decay": g, "kda_beta": beta,
                  "kda_core": torch.stack(outs), "kda_gated_norm": o})
    return linear(o.reshape(T, heads * dim), W[p + "o_proj.weight"])


def mla(W, p, config, x, trace, latent_eps):
    H = config["num_attention_heads"]
    dn, dr, dv = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
    rank = config["kv_lora_rank"]
    T = x.shape[0]
    if config["q_lora_rank"]:
        q = linear(rms_norm(linear(x, W[p + "q_a_proj.weight"]), W[p + "q_a_layernorm.weight"],
                            latent_eps), W[p + "q_b_proj.weight"])
    else:
        q = linear(x, W[p + "q_proj.weight"])
    q = q.view(T, H, dn + dr)
    compressed = linear(x, W[p + "kv_a_proj_with_mqa.weight"])
    latent = rms_norm(compressed[:, :rank], W[p + "kv_a_layernorm.weight"], latent_eps)
    k_shared = compressed[:, rank:]  # no rotary embedding (mla_use_nope)
    kv = linear(latent, W[p + "kv_b_proj.weight"]).view(T, H, dn + dv)
    k = torch.cat([kv[..., :dn], k_shared[:, None, :].expand(T, H, dr)], -1)
    v = kv[..., dn:]
    scores = torch.einsum("thd,shd->hts", q, k) * (dn + dr) ** -0.5
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    probs = torch.softmax(scores.masked_fill(mask, float("-inf")), -1)
    o = torch.einsum("hts,shd->thd", probs, v).reshape(T, H * dv)
    trace.update({"mla_q": q, "mla_latent": latent, "mla_k": k, "mla_v": v, "mla_attn": o})
    return linear(o, W[p + "o_proj.weight"])


def swiglu(x, gate, up, down):
    return linear(torch.nn.functional.silu(linear(x, gate)) * linear(x, up), down)


def moe(W, p, config, x, trace, margins):
    n = config["num_experts"]
    top_k = config["num_experts_per_token"]
    groups = config["num_expert_group"]
    topk_group = config["topk_group"]
    scores = torch.sigmoid(linear(x, W[p + "gate.weight"]))
    choice = scores + W[p + "gate.e_score_correction_bias"]
    group_scores = choice.view(-1, groups, n // groups).topk(2, -1).values.sum(-1)
    if topk_group < groups:
        ranked = group_scores.sort(-1, descending=True).values
        margins.append((ranked[:, topk_group - 1] - ranked[:, topk_group]).min().item())
    chosen_groups = group_scores.topk(topk_group, -1).indices
    group_mask = torch.zeros_like(group_scores, dtype=torch.bool)
    group_mask.scatter_(1, chosen_groups, True)
    expert_mask = group_mask[:, :, None].expand(-1, groups, n // groups).reshape(-1, n)
    masked = choice.masked_fill(~expert_mask, float("-inf"))
    ranked = masked.sort(-1, descending=True).values
    margins.append((ranked[:, top_k - 1] - ranked[:, top_k]).min().item())
    chosen = masked.topk(top_k, -1).indices
    weights = scores.gather(1, chosen)
    if config["moe_renormalize"]:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    weights = weights * config["routed_scaling_factor"]
    routed = torch.zeros_like(x)
    for slot in range(top_k):
        for e in range(n):
            rows = chosen[:, slot] == e
            if rows.any():
                ep = p + f"experts.{e}."
                y = swiglu(x[rows], W[ep + "w1.weight"], W[ep + "w3.weight"], W[ep + "w2.weight"])
                routed[rows] += weights[rows, slot, None] * y
    out = routed
    if config["num_shared_experts"]:
        sp = p + "shared_experts."
        out = out + swiglu(x, W[sp + "gate_proj.weight"], W[sp + "up_proj.weight"],
                           W[sp + "down_proj.weight"])
    trace.update({"moe_chosen": chosen, "moe_weights": weights, "moe_routed": routed})
    return out


def reference_forward(W, config, tokens, latent_eps=LATENT_NORM_EPS, traces=None):
    """Returns (log-probs of tokens[1:] [T-1], the smallest routing margin)."""
    eps = config["rms_norm_eps"]
    x = W["model.embed_tokens.weight"][torch.tensor(tokens)]
    margins = []
    for i, kind in enumerate(layer_kinds(config)):
        p = f"model.layers.{i}."
        trace = {}
        h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        if kind == "kda":
            a = kda(W, p + "self_attn.", config, h, trace)
        else:
            a = mla(W, p + "self_attn.", config, h, trace, latent_eps)
        trace["attention_out"] = a
        x = x + a
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        if i < config["first_k_dense_replace"]:
            m = swiglu(h, W[p + "mlp.gate_proj.weight"], W[p + "mlp.up_proj.weight"],
                       W[p + "mlp.down_proj.weight"])
        else:
            m = moe(W, p + "block_sparse_moe.", config, h, trace, margins)
        trace["feed_forward_out"] = m
        x = x + m
        trace["residual"] = x
        if traces is not None:
            traces.append({"layer": i, "kind": kind, **trace})
    x = rms_norm(x, W["model.norm.weight"], eps)
    logits = linear(x, W["lm_head.weight"])
    logp = torch.log_softmax(logits, -1)
    picked = logp[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])]
    if traces is not None:
        traces.append({"layer": "head", "final_norm": x, "logits": logits})
    return picked, (min(margins) if margins else math.inf)


def upcast(tensors):
    return {n: t.to(torch.float64) for n, t in tensors.items()}


def transformers_logprobs(directory, sequences):
    model, info = KimiLinearForCausalLM.from_pretrained(str(directory), dtype=torch.float32,
                                                        output_loading_info=True)
    unread = {k: v for k, v in info.items() if v}
    if unread:  # a tensor transformers did not take would be silently redrawn
        sys.exit(f"{directory}: transformers did not load every tensor: {unread}")
    model.eval()
    out = []
    with torch.no_grad():
        for tokens in sequences:
            logits = model(torch.tensor([tokens])).logits[0].double()
            logp = torch.log_softmax(logits, -1)
            out.append(logp[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])])
    return out


def draw_sequences(config, W, lengths, seed):
    """Token sequences whose every routing decision clears ROUTING_MARGIN."""
    rng = np.random.default_rng(seed)
    vocab = config["vocab_size"]
    allowed = np.arange(3, vocab - 1)  # not the special ids: bos 1, eos 2, pad vocab-1
    chosen = []
    tries = 0
    for length in lengths:
        while True:
            tries += 1
            if tries > 5000:
                return None
            tokens = [int(t) for t in rng.choice(allowed, size=length)]
            if length == max(lengths):
                # Strider's image-patch placeholder id, which a text-only model reads as text.
                tokens[length // 2] = STRIDER_IMAGE_PATCH
            logp, margin = reference_forward(W, config, tokens)
            if margin > ROUTING_MARGIN:
                chosen.append((tokens, logp, margin))
                break
    return chosen


def check_versions():
    found = {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__,
             "safetensors": safetensors.__version__, "numpy": np.__version__}
    if found != PINNED:
        sys.exit(f"these fixtures are made with {PINNED}, found {found}")
    return found


def generate(args):
    versions = check_versions()
    torch.set_num_threads(1)
    entries = []
    for fixture in FIXTURES:
        config = config_json(fixture)
        directory = HERE / fixture["name"]
        for attempt in range(20):
            seed = fixture["seed"] + 1000 * attempt
            tensors = saved_tensors(draw_weights(config, seed), config)
            stored = write_checkpoint(directory, config, tensors, fixture["storage"],
                                      fixture["shards"])
            W = upcast(read_checkpoint(directory))
            picked = draw_sequences(config, W, fixture["lengths"], seed)
            if picked is not None:
                break
        else:
            sys.exit(f"{fixture['name']}: no weights with clear routing margins")
        sequences = [tokens for tokens, _, _ in picked]
        hf = transformers_logprobs(directory, sequences)
        records = []
        worst_hf = 0.0
        worst_eps = 0.0
        for (tokens, logp, margin), hf_logp in zip(picked, hf):
            diff = (hf_logp - logp).abs().max().item()
            worst_hf = max(worst_hf, diff)
            serving, _ = reference_forward(W, config, tokens, latent_eps=config["rms_norm_eps"])
            worst_eps = max(worst_eps, (serving - logp).abs().max().item())
            records.append({"tokens": tokens, "logprobs": [float(v) for v in logp],
                            "min_routing_margin": margin})
        if worst_hf > TRANSFORMERS_TOLERANCE:
            sys.exit(f"{fixture['name']}: transformers (float32) departs from the float64 "
                     f"reference by {worst_hf:.3g}")
        all_logp = torch.cat([torch.tensor(r["logprobs"]) for r in records])
        entries.append({
            "name": fixture["name"],
            "about": fixture["about"],
            "storage": fixture["storage"],
            "files": sorted(p.name for p in directory.iterdir()),
            "weight_seed": seed,
            "parameters": sum(t.numel() for t in stored.values()),
            "sequences": records,
            "mean_logprob": all_logp.mean().item(),
            "uniform_logprob": -math.log(config["vocab_size"]),
            "transformers_float32_max_abs_diff": worst_hf,
            "latent_norm_eps_rms_norm_eps_max_abs_diff": worst_eps,
        })
        print(f"{fixture['name']}: {entries[-1]['parameters']} parameters, mean log-prob "
              f"{entries[-1]['mean_logprob']:.3f} (uniform {entries[-1]['uniform_logprob']:.3f}), "
              f"routing margin >= {min(r['min_routing_margin'] for r in records):.2e}, "
              f"transformers fp32 within {worst_hf:.2e}, latent eps sensitivity {worst_eps:.2e}")
    expected = {
        "about": "log p(tokens[t+1] | tokens[..t]) for t = 0..T-2 under each fixture, float64 "
                 "from the stored weights; made by make_kimi_fixtures.py generate",
        "generator": {"python": sys.version.split()[0], **versions,
                      "made": datetime.date.today().isoformat()},
        "routing_margin": ROUTING_MARGIN,
        "latent_norm_epsilon": LATENT_NORM_EPS,
        "fixtures": entries,
    }
    text = json.dumps(expected, indent=1)
    # One line per list of numbers: the token ids and log-probs read as rows.
    text = re.sub(r"\[\s*(-?[0-9][^\[\]{}]*?)\s*\]",
                  lambda m: "[" + ", ".join(v.strip() for v in m.group(1).split(",")) + "]", text)
    (HERE / "expected.json").write_text(text + "\n")


def check_export(args):
    fixture = fixture_by_name(args.fixture)
    expected = json.loads((HERE / "expected.json").read_text())
    entry = next(e for e in expected["fixtures"] if e["name"] == fixture["name"])
    original = read_checkpoint(HERE / fixture["name"])
    exported = read_checkpoint(args.dir)
    problems = []
    if sorted(original) != sorted(exported):
        problems.append(f"tensor names differ: missing {sorted(set(original) - set(exported))[:5]}"
                        f", unexpected {sorted(set(exported) - set(original))[:5]}")
    else:
        for name, tensor in original.items():
            other = exported[name]
            if other.dtype != tensor.dtype or other.shape != tensor.shape or \
                    not torch.equal(other, tensor):
                problems.append(f"{name}: {other.dtype} {list(other.shape)} differs from the "
                                f"fixture's {tensor.dtype} {list(tensor.shape)}")
    sequences = [r["tokens"] for r in entry["sequences"]]
    worst = 0.0
    for record, logp in zip(entry["sequences"], transformers_logprobs(args.dir, sequences)):
        worst = max(worst, (logp - torch.tensor(record["logprobs"])).abs().max().item())
    if worst > args.tolerance:
        problems.append(f"log-probs depart from expected.json by {worst:.3g} (> {args.tolerance})")
    for problem in problems[:20]:
        print(problem)
    print(f"{fixture['name']}: transformers on {args.dir}: max |log-prob - expected| = "
          f"{worst:.3g}; {'OK' if not problems else 'FAILED'}")
    return 0 if not problems else 1


def dump(args):
    fixture = fixture_by_name(args.fixture)
    expected = json.loads((HERE / "expected.json").read_text())
    entry = next(e for e in expected["fixtures"] if e["name"] == fixture["name"])
    config = json.loads((HERE / fixture["name"] / "config.json").read_text())
    W = upcast(read_checkpoint(HERE / fixture["name"]))
    tokens = entry["sequences"][args.sequence]["tokens"]
    traces = []
    logp, margin = reference_forward(W, config, tokens, traces=traces)
    out = {"tokens": tokens, "logprobs": logp.tolist(), "min_routing_margin": margin,
           "layers": [{k: (v.tolist() if torch.is_tensor(v) else v) for k, v in t.items()}
                      for t in traces]}
    text = json.dumps(out)
    if args.out:
        pathlib.Path(args.out).write_text(text)
    else:
        print(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("generate", help="rewrite the fixtures and expected.json")
    check = sub.add_parser("check-export", help="an exported directory against expected.json")
    check.add_argument("--fixture", required=True)
    check.add_argument("--dir", required=True)
    check.add_argument("--tolerance", type=float, default=1e-4)
    dumping = sub.add_parser("dump", help="the reference's activations after every sublayer")
    dumping.add_argument("--fixture", required=True)
    dumping.add_argument("--sequence", type=int, default=0)
    dumping.add_argument("--out")
    args = parser.parse_args()
    if args.command == "generate":
        return generate(args)
    if args.command == "check-export":
        return check_export(args)
    return dump(args)


if __name__ == "__main__":
    sys.exit(main())
