"""The tiny decoder-only transformer in numpy: parameters, forward, backward, Adam.

GPT-2 shaped (pre-LayerNorm blocks, learned absolute positions, tanh-GELU MLP, output
projection tied to the token embedding), written out by hand because torch is not a
dependency here (docs/MODELS.md, "Building with torch"). The forward pass below is the
reference the ONNX graph (models/decoder/export.py) is checked against, and the
backward pass is checked against finite differences (tests/unit/test_decoder_model.py).

Every function works in the dtype of the parameters: float32 for training, float64 for
the gradient check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

LN_EPS = 1e-5
GELU_C = float(np.sqrt(2.0 / np.pi))
MASKED = -1e9  # finite, so a row with every key masked gives no NaN (export.py uses the same)

Params = dict[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class Config:
    vocab: int = 257  # 256 bytes + end of text (models/decoder/tokenizer.py)
    d_model: int = 128
    heads: int = 4
    layers: int = 2
    context: int = 256  # rows of the position table: the longest sequence
    mlp: int = 512

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


def param_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    d, m = cfg.d_model, cfg.mlp
    shapes: dict[str, tuple[int, ...]] = {"tok_emb": (cfg.vocab, d), "pos_emb": (cfg.context, d)}
    for i in range(cfg.layers):
        shapes |= {
            f"l{i}.ln1.g": (d,), f"l{i}.ln1.b": (d,),
            f"l{i}.qkv.w": (d, 3 * d), f"l{i}.qkv.b": (3 * d,),
            f"l{i}.proj.w": (d, d), f"l{i}.proj.b": (d,),
            f"l{i}.ln2.g": (d,), f"l{i}.ln2.b": (d,),
            f"l{i}.fc1.w": (d, m), f"l{i}.fc1.b": (m,),
            f"l{i}.fc2.w": (m, d), f"l{i}.fc2.b": (d,),
        }
    return shapes | {"lnf.g": (d,), "lnf.b": (d,)}


def init_params(cfg: Config, seed: int, dtype: Any = np.float32) -> Params:
    """GPT-2's initialisation: N(0, 0.02) weights, the residual projections scaled by
    1/sqrt(2 * layers), LayerNorm gains 1, biases 0."""
    rng = np.random.default_rng(seed)
    params: Params = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith(".g"):
            value = np.ones(shape)
        elif name.endswith(".b"):
            value = np.zeros(shape)
        else:
            std = 0.02 / np.sqrt(2 * cfg.layers) if name.endswith(("proj.w", "fc2.w")) else 0.02
            value = rng.normal(0.0, std, shape)
        params[name] = value.astype(dtype)
    return params


def n_params(params: Params) -> int:
    return int(sum(p.size for p in params.values()))


# -- pieces, each with its backward ------------------------------------------------------
def _ln(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, tuple]:
    xc = x - x.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt((xc * xc).mean(-1, keepdims=True) + LN_EPS)
    xhat = xc * rstd
    return xhat * g + b, (xhat, rstd, g)


def _ln_back(dy: np.ndarray, cache: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xhat, rstd, g = cache
    axes = tuple(range(dy.ndim - 1))
    dg, db = (dy * xhat).sum(axes), dy.sum(axes)
    dxhat = dy * g
    dx = rstd * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return dx, dg, db


def _gelu(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = np.tanh(GELU_C * (x + 0.044715 * x**3))
    return 0.5 * x * (1.0 + t), t


def _gelu_back(dy: np.ndarray, x: np.ndarray, t: np.ndarray) -> np.ndarray:
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3 * 0.044715 * x * x))


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _split_heads(x: np.ndarray, heads: int) -> np.ndarray:  # [B,T,D] -> [B,H,T,Dh]
    b, t, d = x.shape
    return x.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)


def _merge_heads(x: np.ndarray) -> np.ndarray:  # [B,H,T,Dh] -> [B,T,D]
    b, h, t, dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, h * dh)


def _matmul_back(dy: np.ndarray, x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """y = x @ w + b over leading axes: (dx, dw, db)."""
    d_in, d_out = w.shape
    dw = x.reshape(-1, d_in).T @ dy.reshape(-1, d_out)
    return dy @ w.T, dw, dy.reshape(-1, d_out).sum(0)


# -- the model -----------------------------------------------------------------------------
def forward(params: Params, cfg: Config, ids: np.ndarray) -> tuple[np.ndarray, list]:
    """Logits [B, T, vocab] of token ids [B, T] at positions 0..T-1 with causal
    attention, plus what backward() needs."""
    _, t = ids.shape
    dtype = params["tok_emb"].dtype
    x = params["tok_emb"][ids] + params["pos_emb"][:t]
    causal = np.tril(np.ones((t, t), dtype=bool))
    scale = dtype.type(cfg.head_dim**-0.5)
    caches: list = []
    for i in range(cfg.layers):
        p = f"l{i}."
        h, ln1 = _ln(x, params[p + "ln1.g"], params[p + "ln1.b"])
        qkv = h @ params[p + "qkv.w"] + params[p + "qkv.b"]
        q, k, v = (_split_heads(a, cfg.heads) for a in np.split(qkv, 3, axis=-1))
        s = np.where(causal, (q * scale) @ k.transpose(0, 1, 3, 2), dtype.type(MASKED))
        a = _softmax(s)
        o = _merge_heads(a @ v)
        x1 = x + o @ params[p + "proj.w"] + params[p + "proj.b"]
        h2, ln2 = _ln(x1, params[p + "ln2.g"], params[p + "ln2.b"])
        f = h2 @ params[p + "fc1.w"] + params[p + "fc1.b"]
        gf, tf = _gelu(f)
        x = x1 + gf @ params[p + "fc2.w"] + params[p + "fc2.b"]
        caches.append((h, ln1, q, k, v, a, o, h2, ln2, f, gf, tf))
    hf, lnf = _ln(x, params["lnf.g"], params["lnf.b"])
    logits = hf @ params["tok_emb"].T
    return logits, [ids, caches, hf, lnf]


def loss_and_grad(params: Params, cfg: Config, ids: np.ndarray, targets: np.ndarray) -> tuple[float, Params]:
    """Mean cross-entropy of predicting targets[b, t] from ids[b, :t+1], and its gradient."""
    logits, cache = forward(params, cfg, ids)
    probs = _softmax(logits)
    b, t, vocab = logits.shape
    n = b * t
    picked = probs.reshape(n, vocab)[np.arange(n), targets.reshape(n)]
    loss = float(-np.log(picked).mean())
    dlogits = probs.reshape(n, vocab).copy()
    dlogits[np.arange(n), targets.reshape(n)] -= 1.0
    dlogits = (dlogits / n).reshape(b, t, vocab)
    return loss, backward(params, cfg, cache, dlogits)


def backward(params: Params, cfg: Config, cache: list, dlogits: np.ndarray) -> Params:
    ids, caches, hf, lnf = cache
    grads = {k: np.zeros_like(v) for k, v in params.items()}
    t = ids.shape[1]
    scale = params["tok_emb"].dtype.type(cfg.head_dim**-0.5)
    # tied output projection: logits = hf @ tok_emb.T
    grads["tok_emb"] += dlogits.reshape(-1, cfg.vocab).T @ hf.reshape(-1, cfg.d_model)
    dx, grads["lnf.g"], grads["lnf.b"] = _ln_back(dlogits @ params["tok_emb"], lnf)
    for i in reversed(range(cfg.layers)):
        p = f"l{i}."
        h, ln1, q, k, v, a, o, h2, ln2, f, gf, tf = caches[i]
        dgf, grads[p + "fc2.w"], grads[p + "fc2.b"] = _matmul_back(dx, gf, params[p + "fc2.w"])
        dh2, grads[p + "fc1.w"], grads[p + "fc1.b"] = _matmul_back(_gelu_back(dgf, f, tf), h2, params[p + "fc1.w"])
        dx1, grads[p + "ln2.g"], grads[p + "ln2.b"] = _ln_back(dh2, ln2)
        dx1 = dx1 + dx
        do, grads[p + "proj.w"], grads[p + "proj.b"] = _matmul_back(dx1, o, params[p + "proj.w"])
        do = _split_heads(do, cfg.heads)
        da = do @ v.transpose(0, 1, 3, 2)
        dv = a.transpose(0, 1, 3, 2) @ do
        ds = a * (da - (da * a).sum(-1, keepdims=True))  # masked entries have a == 0
        dq = (ds @ k) * scale
        dk = ds.transpose(0, 1, 3, 2) @ (q * scale)
        dqkv = np.concatenate([_merge_heads(d) for d in (dq, dk, dv)], axis=-1)
        dh, grads[p + "qkv.w"], grads[p + "qkv.b"] = _matmul_back(dqkv, h, params[p + "qkv.w"])
        dxa, grads[p + "ln1.g"], grads[p + "ln1.b"] = _ln_back(dh, ln1)
        dx = dx1 + dxa
    np.add.at(grads["tok_emb"], ids, dx)
    grads["pos_emb"][:t] += dx.sum(0)
    return grads


class Adam:
    """Adam (Kingma & Ba) with the learning rate given per step (warm-up and decay are
    the caller's) and the gradient clipped to a global norm."""

    def __init__(self, params: Params, betas: tuple[float, float] = (0.9, 0.99), eps: float = 1e-8,
                 clip: float = 1.0) -> None:
        self.b1, self.b2 = betas
        self.eps, self.clip = eps, clip
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.t = 0

    def step(self, params: Params, grads: Params, lr: float) -> float:
        """Update params in place; returns the gradient norm before clipping."""
        norm = float(np.sqrt(sum(float((g * g).sum()) for g in grads.values())))
        shrink = min(1.0, self.clip / (norm + 1e-12))
        self.t += 1
        c1, c2 = 1 - self.b1**self.t, 1 - self.b2**self.t
        for k, g in grads.items():
            g = g * shrink
            self.m[k] = self.b1 * self.m[k] + (1 - self.b1) * g
            self.v[k] = self.b2 * self.v[k] + (1 - self.b2) * g * g
            params[k] -= (lr * (self.m[k] / c1) / (np.sqrt(self.v[k] / c2) + self.eps)).astype(params[k].dtype)
        return norm
