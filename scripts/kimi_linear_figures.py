#!/usr/bin/env python3
"""Parameter figures of a Kimi Linear checkpoint from its config.json alone, for comparison with
`strider model info --from-hf` (the C++ code derives the same figures from its own table in
common/model/hf_kimi_linear.cc; this script shares nothing with it).

   scripts/kimi_linear_figures.py CONFIG_JSON [--write-index INDEX_JSON --shards N]

Prints total parameters, active parameters per token (every tensor except the routed experts,
plus k/n of those) and the totals by component as JSON. With --write-index, also writes a
model.safetensors.index.json whose weight map lists every published tensor name, spread over N
shards layer by layer, with metadata.total_parameters and metadata.total_size (bf16 everywhere
except A_log and dt_bias, which the published checkpoint stores in fp32).

The tensor names and shapes follow the published checkpoint's layout (vLLM's kimi_linear model
and KDA layer load exactly these names): PyTorch Linear weights are [out, in], the short
convolutions [channels, 1, width], A_log [1, 1, heads, 1].
"""
import argparse
import json


def tensors(c):
    d, v = c['hidden_size'], c['vocab_size']
    la = c['linear_attn_config']
    kda = set(la['kda_layers'])
    H, D, K = la['num_heads'], la['head_dim'], la['short_conv_kernel_size']
    P = H * D
    mh, nope, rope, vd = (c['num_attention_heads'], c['qk_nope_head_dim'], c['qk_rope_head_dim'],
                          c['v_head_dim'])
    kv, qr = c['kv_lora_rank'], c.get('q_lora_rank')
    E, im, S = c['num_experts'], c['moe_intermediate_size'], c.get('num_shared_experts') or 0
    out = [('model.embed_tokens.weight', [v, d], 'embeddings')]
    for i in range(c['num_hidden_layers']):
        p = f'model.layers.{i}.'
        out += [(p + 'input_layernorm.weight', [d], 'norms'),
                (p + 'post_attention_layernorm.weight', [d], 'norms')]
        a = p + 'self_attn.'
        if i + 1 in kda:
            out += [(a + 'q_proj.weight', [P, d], 'kda_attention'),
                    (a + 'k_proj.weight', [P, d], 'kda_attention'),
                    (a + 'v_proj.weight', [P, d], 'kda_attention'),
                    (a + 'q_conv1d.weight', [P, 1, K], 'kda_attention'),
                    (a + 'k_conv1d.weight', [P, 1, K], 'kda_attention'),
                    (a + 'v_conv1d.weight', [P, 1, K], 'kda_attention'),
                    (a + 'A_log', [1, 1, H, 1], 'kda_attention'),
                    (a + 'dt_bias', [P], 'kda_attention'),
                    (a + 'f_a_proj.weight', [D, d], 'kda_attention'),
                    (a + 'f_b_proj.weight', [P, D], 'kda_attention'),
                    (a + 'b_proj.weight', [H, d], 'kda_attention'),
                    (a + 'g_a_proj.weight', [D, d], 'kda_attention'),
                    (a + 'g_b_proj.weight', [P, D], 'kda_attention'),
                    (a + 'o_norm.weight', [D], 'kda_attention'),
                    (a + 'o_proj.weight', [d, P], 'kda_attention')]
        else:
            if qr:
                out += [(a + 'q_a_proj.weight', [qr, d], 'mla_attention'),
                        (a + 'q_a_layernorm.weight', [qr], 'mla_attention'),
                        (a + 'q_b_proj.weight', [mh * (nope + rope), qr], 'mla_attention')]
            else:
                out += [(a + 'q_proj.weight', [mh * (nope + rope), d], 'mla_attention')]
            out += [(a + 'kv_a_proj_with_mqa.weight', [kv + rope, d], 'mla_attention'),
                    (a + 'kv_a_layernorm.weight', [kv], 'mla_attention'),
                    (a + 'kv_b_proj.weight', [mh * (nope + vd), kv], 'mla_attention'),
                    (a + 'o_proj.weight', [d, mh * vd], 'mla_attention')]
        if i >= c['first_k_dense_replace'] and i % c.get('moe_layer_freq', 1) == 0:
            m = p + 'block_sparse_moe.'
            out += [(m + 'gate.weight', [E, d], 'router'),
                    (m + 'gate.e_score_correction_bias', [E], 'router')]
            for e in range(E):
                out += [(m + f'experts.{e}.w1.weight', [im, d], 'routed_experts'),
                        (m + f'experts.{e}.w2.weight', [d, im], 'routed_experts'),
                        (m + f'experts.{e}.w3.weight', [im, d], 'routed_experts')]
            if S:
                out += [(m + 'shared_experts.gate_proj.weight', [im * S, d], 'shared_experts'),
                        (m + 'shared_experts.up_proj.weight', [im * S, d], 'shared_experts'),
                        (m + 'shared_experts.down_proj.weight', [d, im * S], 'shared_experts')]
        else:
            ii = c['intermediate_size']
            out += [(p + 'mlp.gate_proj.weight', [ii, d], 'dense_mlp'),
                    (p + 'mlp.up_proj.weight', [ii, d], 'dense_mlp'),
                    (p + 'mlp.down_proj.weight', [d, ii], 'dense_mlp')]
    out.append(('model.norm.weight', [d], 'norms'))
    if not c.get('tie_word_embeddings', False):
        out.append(('lm_head.weight', [v, d], 'lm_head'))
    return out


def count(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('config')
    parser.add_argument('--write-index')
    parser.add_argument('--shards', type=int, default=1)
    args = parser.parse_args()
    c = json.load(open(args.config))
    ts = tensors(c)
    by = {}
    for _, shape, comp in ts:
        by[comp] = by.get(comp, 0) + count(shape)
    total = sum(by.values())
    k, n = c['num_experts_per_token'], c['num_experts']
    active = total - by.get('routed_experts', 0) + by.get('routed_experts', 0) * k // n
    print(json.dumps({'total_parameters': total, 'active_parameters': active,
                      'tensors': len(ts), 'by_component': by}, indent=2))
    if args.write_index:
        layers = c['num_hidden_layers']
        size, weight_map = 0, {}
        for name, shape, _ in ts:
            fp32 = name.endswith('.A_log') or name.endswith('.dt_bias')
            size += count(shape) * (4 if fp32 else 2)
            layer = int(name.split('.')[2]) if name.startswith('model.layers.') else (
                0 if name.startswith('model.embed') else layers - 1)
            shard = layer * args.shards // layers + 1
            weight_map[name] = f'model-{shard:05d}-of-{args.shards:05d}.safetensors'
        with open(args.write_index, 'w') as f:
            json.dump({'metadata': {'total_parameters': total, 'total_size': size},
                       'weight_map': weight_map}, f, indent=2)
            f.write('\n')


if __name__ == '__main__':
    main()
