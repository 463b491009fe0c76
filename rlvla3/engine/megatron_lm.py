"""The language model of a VLA trained with megatron-core (tensor parallel), exchanging weights
with the transformers Llama layout that Generators run.

The Trainer side of `policy.lm_backend=megatron` (openvla with lm=llama): the same Llama
architecture as transformers' `LlamaForCausalLM` (RMSNorm, SwiGLU, RoPE, grouped-query attention,
no biases, untied output layer) built as Megatron's `GPTModel`, its layers split over
`policy.tensor_parallel` Trainer ranks. Published weights are converted back to the transformers
layout, so a Generator loads them like any other version (the versioned flat float32 format of
weights.py): nothing on the Generator side knows Megatron exists.

Conversion (per layer; `hd` = head dim, TP splits every piece along its parallel dim):
    q_proj [nq*hd, h], k_proj, v_proj [ng*hd, h]  <->  linear_qkv [ng * (nq/ng + 2) * hd, h], per
        query group g: the group's nq/ng query heads, then its key head, then its value head
    gate_proj, up_proj [f, h]                      <->  linear_fc1 [2f, h] = per TP rank
        [gate shard; up shard] (Megatron's gated unit: silu(first half) * second half)
    o_proj [h, nq*hd] <-> linear_proj;  down_proj [h, f] <-> linear_fc2 (split along inputs)
    embed_tokens <-> embedding.word_embeddings, lm_head <-> output_layer (split along vocab)
    input_layernorm, post_attention_layernorm <-> input_layernorm, pre_mlp_layernorm (replicated)

On CPU (tests here) three of Megatron's GPU assumptions are swapped, as measured in
../shared/notes (megatron-core 0.16.1): core attention is torch SDPA (`SDPAAttention`), RoPE
frequencies stay on the host (`host_rotary_class`), and the optimizer is plain torch Adam over the
local shards (Megatron's own optimizer wrappers are GPU-only). Pipeline parallelism is not
implemented: the conversion and the engine use pp = 1 (a Trainer replica is TP ranks only).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn


# ---------------------------------------------------------------- parallel state and the model
def init_parallel(tp: int, seed: int = 0) -> None:
    """Megatron's parallel state over the already initialised torch.distributed world."""
    from megatron.core import parallel_state, tensor_parallel

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    if torch.cuda.is_available():
        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def transformer_config(hf, tp: int):
    """A Megatron TransformerConfig equal to the transformers Llama config `hf`."""
    from megatron.core.transformer import TransformerConfig

    on_gpu = torch.cuda.is_available()
    return TransformerConfig(
        num_layers=hf.num_hidden_layers, hidden_size=hf.hidden_size, ffn_hidden_size=hf.intermediate_size,
        num_attention_heads=hf.num_attention_heads, num_query_groups=hf.num_key_value_heads,
        kv_channels=hf.hidden_size // hf.num_attention_heads, normalization="RMSNorm", layernorm_epsilon=hf.rms_norm_eps,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, add_qkv_bias=False,
        hidden_dropout=0.0, attention_dropout=0.0, tensor_model_parallel_size=tp,
        sequence_parallel=False, use_cpu_initialization=not on_gpu, params_dtype=torch.float32,
        bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        bias_dropout_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False)


class SDPAAttention(nn.Module):
    """Megatron's core-attention slot filled with torch SDPA (the stock module allocates on the
    current CUDA device). Shapes: q [s, b, heads, hd], k/v [s, b, groups, hd] -> [s, b, heads*hd]."""

    def __init__(self, config, layer_number=None, attn_mask_type=None, attention_type=None, **_):
        super().__init__()
        self.config = config

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None, packed_seq_params=None):
        s, b, heads, hd = query.shape
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
        rep = heads // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)   # group g serves heads g*rep..(g+1)*rep-1
        if attention_mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:   # Megatron's mask: True = masked out
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=~attention_mask)
        return out.permute(2, 0, 1, 3).reshape(s, b, heads * hd)


def build_gpt(hf, tp: int):
    """Megatron GPTModel with `hf`'s Llama architecture; on CPU with SDPA attention and host RoPE."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    if not torch.cuda.is_available():
        spec.submodules.self_attention.submodules.core_attention = SDPAAttention
    model = GPTModel(transformer_config(hf, tp), spec, vocab_size=hf.vocab_size,
                     max_sequence_length=hf.max_position_embeddings, position_embedding_type="rope",
                     rotary_base=getattr(hf, "rope_theta", None) or hf.rope_parameters["rope_theta"],
                     share_embeddings_and_output_weights=False)
    if not torch.cuda.is_available():
        assert isinstance(model.rotary_pos_emb, RotaryEmbedding)
        model.rotary_pos_emb.__class__ = host_rotary_class()
    return model


def _host_rotary_forward(self, max_seq_len: int, offset: int = 0, packed_seq: bool = False, cp_group=None):
    """RoPE angles [s, 1, 1, hd] computed where inv_freq lives (Megatron moves it to CUDA)."""
    freqs = self.get_freqs_non_repeated(max_seq_len, offset)
    return torch.cat((freqs, freqs), dim=-1)[:, None, None, :]


@functools.lru_cache(maxsize=None)
def host_rotary_class():
    """RotaryEmbedding with `_host_rotary_forward` (a subclass made on first use: importing
    megatron-core at module import would cost every rank seconds)."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    return type("HostRotary", (RotaryEmbedding,), {"forward": _host_rotary_forward})


# ---------------------------------------------------------------- running it
def causal_padding_mask(mask_2d: torch.Tensor) -> torch.Tensor:
    """[b, s] 1 = token, 0 = padding -> Megatron's [b, 1, s, s] bool mask (True = masked out):
    causal, and no query attends to a padding key."""
    s = mask_2d.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=mask_2d.device).triu(1)
    return (causal[None] | (mask_2d[:, None, :] == 0))[:, None]


def hidden_states(model, embeds: torch.Tensor, mask_2d: torch.Tensor) -> torch.Tensor:
    """Final-norm hidden states [b, s, h] of input embeddings [b, s, h] (positions 0..s-1)."""
    x = embeds.transpose(0, 1).contiguous()
    rot = model.rotary_pos_emb(x.shape[0])
    return model.decoder(hidden_states=x, attention_mask=causal_padding_mask(mask_2d), rotary_pos_emb=rot).transpose(0, 1)


class _GatherLastDim(torch.autograd.Function):
    """All-gather along the last dim over the TP group; the gradient is this rank's slice.
    (Megatron's own gather allocates its buffer on the current CUDA device.)"""

    @staticmethod
    def forward(ctx, x):
        import torch.distributed as dist
        from megatron.core import parallel_state

        group = parallel_state.get_tensor_model_parallel_group()
        ctx.rank, ctx.n = dist.get_rank(group), dist.get_world_size(group)
        if ctx.n == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(ctx.n)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, -1)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(ctx.n, -1)[ctx.rank].contiguous() if ctx.n > 1 else grad


def full_logits(model, h: torch.Tensor) -> torch.Tensor:
    """Logits over the whole vocabulary [b, s, V] (the output layer is split along the vocab)."""
    out, _ = model.output_layer(h.transpose(0, 1).contiguous())
    return _GatherLastDim.apply(out).transpose(0, 1)


class _Out:
    def __init__(self, h):
        self.last_hidden_state = h


class MegatronLlama(nn.Module):
    """A Megatron GPTModel dressed as the slice of `LlamaForCausalLM` that the openvla policy
    uses on the Trainer: `get_input_embeddings()`, `model(inputs_embeds=..., attention_mask=...)`,
    `config`, plus `action_logits` (the vocab-split output layer needs a gather first)."""

    def __init__(self, hf_config, tp: int):
        super().__init__()
        self.config = hf_config
        self.gpt = build_gpt(hf_config, tp)
        outer = self

        class _Body:
            def __call__(self, inputs_embeds, attention_mask, position_ids=None, **_):
                return _Out(hidden_states(outer.gpt, inputs_embeds, attention_mask))

        self.model = _Body()

    def get_input_embeddings(self):
        return self.gpt.embedding.word_embeddings

    def action_logits(self, h: torch.Tensor, first_id: int) -> torch.Tensor:
        return full_logits(self.gpt, h)[..., first_id:]


# ---------------------------------------------------------------- weight conversion
def _split(t: torch.Tensor, tp: int, rank: int, dim: int) -> torch.Tensor:
    return t.chunk(tp, dim)[rank].contiguous()


def hf_to_mcore(hf: dict[str, torch.Tensor], cfg, tp: int, rank: int, prefix: str = "model.") -> dict[str, torch.Tensor]:
    """This TP rank's GPTModel state from a transformers Llama state dict."""
    nq, ng = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = cfg.hidden_size // nq
    out = {"embedding.word_embeddings.weight": _split(hf[f"{prefix}embed_tokens.weight"], tp, rank, 0),
           "decoder.final_layernorm.weight": hf[f"{prefix}norm.weight"],
           "output_layer.weight": _split(hf["lm_head.weight"], tp, rank, 0)}
    for i in range(cfg.num_hidden_layers):
        src, dst = f"{prefix}layers.{i}.", f"decoder.layers.{i}."
        q = hf[src + "self_attn.q_proj.weight"].reshape(ng, nq // ng * hd, -1)
        k = hf[src + "self_attn.k_proj.weight"].reshape(ng, hd, -1)
        v = hf[src + "self_attn.v_proj.weight"].reshape(ng, hd, -1)
        qkv = torch.cat([q, k, v], 1)                          # [groups, (nq/ng + 2) * hd, h]
        out[dst + "self_attention.linear_qkv.weight"] = _split(qkv, tp, rank, 0).flatten(0, 1)
        out[dst + "self_attention.linear_proj.weight"] = _split(hf[src + "self_attn.o_proj.weight"], tp, rank, 1)
        gate = _split(hf[src + "mlp.gate_proj.weight"], tp, rank, 0)
        up = _split(hf[src + "mlp.up_proj.weight"], tp, rank, 0)
        out[dst + "mlp.linear_fc1.weight"] = torch.cat([gate, up], 0)
        out[dst + "mlp.linear_fc2.weight"] = _split(hf[src + "mlp.down_proj.weight"], tp, rank, 1)
        out[dst + "input_layernorm.weight"] = hf[src + "input_layernorm.weight"]
        out[dst + "pre_mlp_layernorm.weight"] = hf[src + "post_attention_layernorm.weight"]
    return out


def mcore_to_hf(shards: list[dict[str, torch.Tensor]], cfg, prefix: str = "model.") -> dict[str, torch.Tensor]:
    """A transformers Llama state dict from the GPTModel states of all TP ranks (in rank order)."""
    nq, ng = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = cfg.hidden_size // nq
    cat = lambda key, dim: torch.cat([s[key] for s in shards], dim)  # noqa: E731
    out = {f"{prefix}embed_tokens.weight": cat("embedding.word_embeddings.weight", 0),
           f"{prefix}norm.weight": shards[0]["decoder.final_layernorm.weight"],
           "lm_head.weight": cat("output_layer.weight", 0)}
    for i in range(cfg.num_hidden_layers):
        src, dst = f"decoder.layers.{i}.", f"{prefix}layers.{i}."
        qkv = cat(src + "self_attention.linear_qkv.weight", 0).reshape(ng, (nq // ng + 2) * hd, -1)
        q, k, v = qkv.split([nq // ng * hd, hd, hd], 1)
        out[dst + "self_attn.q_proj.weight"] = q.reshape(nq * hd, -1)
        out[dst + "self_attn.k_proj.weight"] = k.reshape(ng * hd, -1)
        out[dst + "self_attn.v_proj.weight"] = v.reshape(ng * hd, -1)
        out[dst + "self_attn.o_proj.weight"] = cat(src + "self_attention.linear_proj.weight", 1)
        halves = [s[src + "mlp.linear_fc1.weight"].chunk(2, 0) for s in shards]
        out[dst + "mlp.gate_proj.weight"] = torch.cat([g for g, _ in halves], 0)
        out[dst + "mlp.up_proj.weight"] = torch.cat([u for _, u in halves], 0)
        out[dst + "mlp.down_proj.weight"] = cat(src + "mlp.linear_fc2.weight", 1)
        out[dst + "input_layernorm.weight"] = shards[0][src + "input_layernorm.weight"]
        out[dst + "post_attention_layernorm.weight"] = shards[0][src + "pre_mlp_layernorm.weight"]
    return out


def local_state(gpt) -> dict[str, torch.Tensor]:
    """This rank's parameters by name (no Megatron extra state)."""
    return {k: v.detach() for k, v in gpt.state_dict().items() if not k.endswith("_extra_state")}


def gather_hf(gpt, cfg) -> dict[str, torch.Tensor]:
    """The full transformers Llama state dict, on every TP rank (an all-gather of the shards)."""
    return gather_named(local_state(gpt), cfg)


def gather_named(local: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """Like gather_hf, for any tensors named like the GPTModel's parameters (e.g. gradients)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    group = parallel_state.get_tensor_model_parallel_group()
    shards = [dict() for _ in range(dist.get_world_size(group))]
    for key in sorted(local):
        parts = [torch.empty_like(local[key]) for _ in shards]
        dist.all_gather(parts, local[key].contiguous(), group=group)
        for s, p in zip(shards, parts):
            s[key] = p
    return mcore_to_hf(shards, cfg)
