"""`tiny`: a small VLA in plain torch, shaped like the real ones.

Tokens: image patches (a linear patch encoder per camera, ViT style), instruction words, one
proprio token, then one query token per action token (K*D for a chunk of K actions of D dims) and one value token. A pre-norm
transformer encoder mixes them; each action query predicts `action_bins` logits for its
dimension (OpenVLA-style discrete bins, decoded in parallel as in OpenVLA-OFT), and the value
token feeds the value head V(s).
"""
from __future__ import annotations

import torch
from torch import nn

from .base import TokenPolicy


class TinyVLA(TokenPolicy):
    def __init__(self, pcfg, spec):
        super().__init__()
        torch.manual_seed(pcfg.init_seed)
        d, p = pcfg.d_model, pcfg.patch
        self.patch, self.action_bins, self.action_dim, self.chunk = p, pcfg.action_bins, spec.action_dim, spec.chunk
        side = spec.image_size // p
        self.patch_embed = nn.Linear(p * p * 3, d)
        self.patch_pos = nn.Parameter(sincos_2d(side, d).repeat(1, spec.cameras, 1))
        n_patches = spec.cameras * side * side
        # A global image token: a linear map of all (narrow) patch features in place order, so
        # "what is where" is linearly readable without first learning sharp attention.
        self.patch_narrow = nn.Linear(p * p * 3, 8)
        self.global_embed = nn.Linear(n_patches * 8, d)
        self.word_embed = nn.Embedding(spec.vocab, d, padding_idx=0)
        # FiLM (as in RT-1's image encoder): the instruction scales and shifts the narrow patch
        # features, so "where is the named thing" becomes linearly readable by the global token.
        self.film = nn.Linear(d, 2 * 8)
        nn.init.zeros_(self.film.weight)
        nn.init.zeros_(self.film.bias)
        self.word_pos = nn.Parameter(torch.randn(1, spec.instruction_len, d) * 0.5)
        self.proprio_embed = nn.Linear(spec.proprio_dim, d)
        self.queries = nn.Parameter(torch.randn(1, spec.chunk * spec.action_dim + 1, d) * 0.5)
        layer = nn.TransformerEncoderLayer(d, pcfg.heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, pcfg.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.action_head = nn.Linear(d, pcfg.action_bins)
        self.value_head = nn.Linear(d, 1)
        # A small action head starts near a uniform action distribution.
        nn.init.normal_(self.action_head.weight, std=0.01)
        nn.init.zeros_(self.action_head.bias)

    def _patches(self, images: torch.Tensor, words: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n, cams, h, w, c = images.shape
        p = self.patch
        x = images.float().div(255.0).reshape(n, cams, h // p, p, w // p, p, c)
        x = x.permute(0, 1, 2, 4, 3, 5, 6).reshape(n, cams * (h // p) * (w // p), p * p * c)
        lang = (words * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        gamma, beta = self.film(lang)[:, None].chunk(2, -1)
        glob = self.global_embed(torch.relu(self.patch_narrow(x) * (1 + gamma) + beta).flatten(1))[:, None]
        return torch.cat([self.patch_embed(x) + self.patch_pos, glob], 1)

    def logits_and_value(self, images, proprio, tokens):
        n = images.shape[0]
        emb = self.word_embed(tokens.long())
        words = emb + self.word_pos
        x = torch.cat([self._patches(images, emb, (tokens > 1).float()), words, self.proprio_embed(proprio.float())[:, None],
                       self.queries.expand(n, -1, -1)], 1)
        pad = torch.zeros(x.shape[:2], dtype=torch.bool, device=x.device)
        pad[:, -(tokens.shape[1] + 1 + self.queries.shape[1]):-(1 + self.queries.shape[1])] = tokens == 0
        h = self.norm(self.encoder(x, src_key_padding_mask=pad))
        q = h[:, -self.queries.shape[1]:]
        return self.action_head(q[:, :-1]), self.value_head(q[:, -1])[:, 0]


def sincos_2d(side: int, d: int) -> torch.Tensor:
    """Fixed 2-D sine-cosine position codes [1, side*side, d] (MAE-style) used as the initial
    patch positions: a model trained from scratch can tell where a patch is from step one,
    and "above/left of the centre" is nearly linear in these codes."""
    q = d // 4
    freqs = 1.0 / (10000 ** (torch.arange(q, dtype=torch.float32) / q))
    rows, cols = torch.meshgrid(torch.arange(side, dtype=torch.float32), torch.arange(side, dtype=torch.float32), indexing="ij")
    r = rows.reshape(-1, 1) * freqs
    c = cols.reshape(-1, 1) * freqs
    pe = torch.cat([r.sin(), r.cos(), c.sin(), c.cos()], 1)
    return torch.nn.functional.pad(pe, (0, d - pe.shape[1]))[None]
