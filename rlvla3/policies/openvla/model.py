"""`openvla`: an OpenVLA-style VLA built from transformers' own model classes.

    images -> SigLIP vision tower (SiglipVisionModel) -> 2-layer MLP projector (Prismatic's)
    instruction ids -> the language model's embeddings;  proprio -> an MLP projector (OFT's)
    [image tokens | instruction | proprio | action tokens] -> Qwen2 or Llama causal LM

Actions are discrete: each action dim of each chunk step is one token among the last
`action_bins` ids of the LM vocabulary (padded to a multiple of 128, as Megatron pads it, so that
it splits evenly over tensor-parallel ranks) (OpenVLA reuses the 256 least-used ids the same way);
log pi(a|s) is the sum over the K*D action-token log-probs, restricted to those ids.
- decoding=autoregressive (OpenVLA): token i is predicted at the position of token i-1 (token 0
  at the proprio token); `act` decodes with the LM's KV cache, `evaluate` is one teacher-forced
  forward over the sampled tokens.
- decoding=parallel (OpenVLA-OFT): K*D learned "empty" action embeddings follow the prefix and all
  tokens come from one forward. (OFT attends bidirectionally among them; with a causal LM each
  sees the prefix and earlier empties, which carry no information, so it is the same model.)
The value head reads the LM's last hidden state at the proprio token (the end of the prefix).

This class is the family random-initialised from `policy` sizes (RL from scratch, tests,
benchmarks; instruction ids are the project's hashed words). `policy.pretrained` loads a released
OpenVLA folder instead (`released.ReleasedOpenVLA`: the same decoding over the published
Prismatic model, its tokenizer, action ids and un-normalisation).
"""
from __future__ import annotations

import torch
from torch import nn

from ..base import TokenPolicy, gumbel_argmax, token_logp_entropy


def end_of_prefix(mask: torch.Tensor) -> torch.Tensor:
    """The index of each row's last attended prefix position [n] (where the first action token
    is predicted and V(s) is read): padding may sit inside or at the end of the prefix."""
    return (mask * torch.arange(1, mask.shape[1] + 1, device=mask.device)).argmax(1)


class OpenVLA(TokenPolicy):
    fully_trained = ("value_head", "projector", "proprio_proj")

    def __init__(self, pcfg, spec):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, SiglipVisionConfig, SiglipVisionModel

        torch.manual_seed(pcfg.init_seed)
        self.action_bins, self.action_dim, self.chunk = pcfg.action_bins, spec.action_dim, spec.chunk
        self.n_act = spec.chunk * spec.action_dim
        self.autoregressive = pcfg.decoding == "autoregressive"
        lm_cls, lm_cfg_cls = (Qwen2ForCausalLM, Qwen2Config) if pcfg.lm == "qwen2" else (LlamaForCausalLM, LlamaConfig)
        d = pcfg.d_model
        self.vision = SiglipVisionModel(SiglipVisionConfig(
            hidden_size=d, intermediate_size=4 * d, num_hidden_layers=pcfg.layers, num_attention_heads=pcfg.heads,
            image_size=spec.image_size, patch_size=pcfg.patch))
        self.lm = lm_cls(lm_cfg_cls(
            hidden_size=d, intermediate_size=4 * d, num_hidden_layers=pcfg.layers, num_attention_heads=pcfg.heads,
            num_key_value_heads=pcfg.heads, vocab_size=-(-(pcfg.vocab + pcfg.action_bins) // 128) * 128,
            max_position_embeddings=1024, tie_word_embeddings=False))
        dv, dl = self.vision.config.hidden_size, self.lm.config.hidden_size
        self.projector = nn.Sequential(nn.Linear(dv, dl), nn.GELU(), nn.Linear(dl, dl))
        self.proprio_proj = nn.Sequential(nn.Linear(spec.proprio_dim, dl), nn.GELU(), nn.Linear(dl, dl))
        self.first_action_id = self.lm.config.vocab_size - self.action_bins   # the last `action_bins` ids
        self.add_heads(dl, torch.arange(self.first_action_id, self.lm.config.vocab_size))

    def add_heads(self, width: int, action_ids: torch.Tensor) -> None:
        """What RL adds to an LM-based VLA: the value head, the action ids (bin b is LM token
        action_ids[b]) and, for parallel decoding, the action queries."""
        self.value_head = nn.Linear(width, 1)
        self.register_buffer("action_ids", action_ids, persistent=False)
        if not self.autoregressive:
            self.action_queries = nn.Parameter(torch.randn(1, self.n_act, width) * 0.02)

    # ------------------------------------------------------------ pieces

    def _prefix(self, images, proprio, tokens) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings [n, S, d] and attention mask [n, S] of images, instruction and proprio."""
        n, cams = images.shape[:2]
        size = self.vision.config.image_size
        x = images.reshape(n * cams, *images.shape[2:]).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)  # SigLIP: [-1, 1]
        if x.shape[-1] != size:
            x = nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
        img = self.projector(self.vision(pixel_values=x).last_hidden_state).reshape(n, -1, self.lm.config.hidden_size)
        words = self.lm.get_input_embeddings()(tokens.long())
        prop = self.proprio_proj(proprio.float())[:, None]
        emb = torch.cat([img, words, prop], 1)
        mask = torch.ones(emb.shape[:2], dtype=torch.long, device=emb.device)
        mask[:, img.shape[1]:img.shape[1] + tokens.shape[1]] = (tokens != 0).long()
        return emb, mask

    def _action_logits(self, h: torch.Tensor) -> torch.Tensor:
        """LM-head logits of the action ids only: [..., bins]."""
        if hasattr(self.lm, "action_logits"):   # a Megatron LM (megatron_lm.MegatronLlama)
            return self.lm.action_logits(h, self.first_action_id)
        w = self.lm.lm_head.weight[self.action_ids]
        b = self.lm.lm_head.bias[self.action_ids] if self.lm.lm_head.bias is not None else None
        return nn.functional.linear(h, w, b)

    def _action_embeddings(self, bins: torch.Tensor) -> torch.Tensor:
        return self.lm.get_input_embeddings()(self.action_ids[bins.long()])

    def _positions(self, mask: torch.Tensor) -> torch.Tensor:
        # Sequence indices (padding is masked, not skipped), as in Megatron's RoPE: the same
        # weights give the same outputs under either LM implementation.
        return torch.arange(mask.shape[1], device=mask.device).expand(mask.shape[0], -1)

    def _run(self, emb, mask, **kw):
        return self.lm.model(inputs_embeds=emb, attention_mask=mask, position_ids=self._positions(mask), **kw)

    # ------------------------------------------------------------ one forward over known actions
    def _logits_and_value(self, images, proprio, tokens, action_tokens=None):
        emb, mask = self._prefix(images, proprio, tokens)
        n, s = emb.shape[:2]
        last = end_of_prefix(mask)
        tail = self._action_embeddings(action_tokens[:, :-1]) if self.autoregressive else self.action_queries.expand(n, -1, -1)
        full = torch.cat([emb, tail], 1)
        h = self._run(full, torch.cat([mask, torch.ones(tail.shape[:2], dtype=mask.dtype, device=mask.device)], 1)).last_hidden_state
        rows = torch.arange(n, device=h.device)
        value = self.value_head(h[rows, last])[:, 0]
        if self.autoregressive:   # token i is predicted where token i-1 is (token 0: the prefix's end)
            at = torch.cat([last[:, None], s + torch.arange(self.n_act - 1, device=h.device).expand(n, -1)], 1)
            act_h = h[rows[:, None], at]
        else:
            act_h = h[:, s:]
        return self._action_logits(act_h), value

    def logits_and_value(self, images, proprio, tokens):
        if self.autoregressive:
            raise RuntimeError("autoregressive decoding has no single-forward logits; use act/evaluate")
        return self._logits_and_value(images, proprio, tokens)

    def evaluate(self, images, proprio, tokens, sample, per_token: bool = False):
        logits, value = self._logits_and_value(images, proprio, tokens, sample)
        logp, entropy = token_logp_entropy(logits, sample, per_token)
        return logp, entropy, value.float()

    @torch.no_grad()
    def act(self, images, proprio, tokens, noise):
        if not self.autoregressive:
            return super().act(images, proprio, tokens, noise)
        emb, mask = self._prefix(images, proprio, tokens)
        out = self._run(emb, mask, use_cache=True)
        h, cache = out.last_hidden_state[torch.arange(emb.shape[0], device=emb.device), end_of_prefix(mask)], out.cache
        value = self.value_head(h)[:, 0]
        pos = self._positions(mask)[:, -1:]
        toks, logps = [], []
        for i in range(self.n_act):
            logp_all = torch.log_softmax(self._action_logits(h).float(), -1)
            tok = gumbel_argmax(logp_all, noise[:, i])
            toks.append(tok)
            logps.append(logp_all.gather(-1, tok[:, None])[:, 0])
            if i == self.n_act - 1:
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            pos = pos + 1
            e = self._action_embeddings(tok[:, None])
            out = self.lm.model(inputs_embeds=e, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
            h, cache = out.last_hidden_state[:, -1], out.cache
        return torch.stack(toks, 1).to(torch.int32), torch.stack(logps, 1).sum(-1), value.float()
