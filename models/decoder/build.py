"""Train the tiny decoder with numpy and export it to ONNX: ``python -m models.decoder.build``.

Writes models/decoder/decoder_tiny.onnx (~1.9 MB, committed) and models/decoder/spec.json.

Training text: this repository's own README.md and docs/*.md (tidebatch's text, under
the project's Apache-2.0 licence, pyproject.toml), read at build time in sorted order,
UTF-8 bytes, end of text (token 256) after each file (models/decoder/tokenizer.py). The
last 5 % of the token stream is held out for the validation loss. The sha256 of the
token stream goes into spec.json: the docs change, and a rebuild from other docs gives
another model.

Model and training (models/decoder/numpy_model.py): 2 layers, d_model 128, 4 heads,
MLP 512, context 256, ~0.46 M parameters. STEPS steps of BATCH windows of 256 tokens
drawn at random from the training part, Adam, warm-up then cosine decay, gradient
clipped to norm 1. Seeded: the same text and the same numpy/BLAS give the same weights
(float32 sums in BLAS may round differently on another CPU). A few minutes on one core.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from models.decoder import tokenizer
from models.decoder.export import IR_VERSION, OPSET, build_graph, input_names, output_names
from models.decoder.numpy_model import Adam, Config, forward, init_params, loss_and_grad, n_params

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
ONNX_NAME = "decoder_tiny.onnx"
MODEL_NAME = "decoder_tiny"
MODEL_VERSION = "1.0.0"
CONFIG = Config()

INIT_SEED = 1
DATA_SEED = 2
STEPS = 600
BATCH = 8
SEQ = 256
LR = 5e-3
LR_MIN = 3e-4
WARMUP = 20
HELDOUT = 0.05
EVAL_WINDOWS = 16


def training_files(repo: Path = REPO) -> list[Path]:
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def token_stream(files: list[Path]) -> np.ndarray:
    tokens: list[int] = []
    for path in files:
        tokens += tokenizer.encode(path.read_text(encoding="utf-8")) + [tokenizer.EOS]
    return np.array(tokens, dtype=np.int64)


def _windows(stream: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w = np.stack([stream[s : s + SEQ + 1] for s in starts])
    return w[:, :-1], w[:, 1:]


def _lr(step: int) -> float:
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    progress = (step - WARMUP) / max(1, STEPS - WARMUP)
    return LR_MIN + 0.5 * (LR - LR_MIN) * (1 + np.cos(np.pi * progress))


def _mean_loss(params: dict, cfg: Config, ids: np.ndarray, targets: np.ndarray) -> float:
    logits, _ = forward(params, cfg, ids)
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-np.take_along_axis(logp, targets[..., None], -1).mean())


def train(stream: np.ndarray, log: Any = print) -> tuple[dict, dict[str, Any]]:
    """The trained parameters and the figures spec.json records."""
    split = int(len(stream) * (1 - HELDOUT))
    train_part, held = stream[:split], stream[split:]
    rng = np.random.default_rng(DATA_SEED)
    eval_starts = np.linspace(0, len(held) - SEQ - 1, EVAL_WINDOWS).astype(np.int64)
    held_ids, held_targets = _windows(held, eval_starts)
    params = init_params(CONFIG, INIT_SEED)
    opt = Adam(params)
    initial_heldout = _mean_loss(params, CONFIG, held_ids, held_targets)
    t0 = time.perf_counter()
    losses: list[float] = []
    for step in range(STEPS):
        ids, targets = _windows(train_part, rng.integers(0, len(train_part) - SEQ - 1, BATCH))
        loss, grads = loss_and_grad(params, CONFIG, ids, targets)
        opt.step(params, grads, _lr(step))
        losses.append(loss)
        if step % 25 == 0 or step == STEPS - 1:
            log(f"step {step:4d}  loss {loss:.3f}  ({time.perf_counter() - t0:.0f} s)")
    seconds = time.perf_counter() - t0
    heldout = _mean_loss(params, CONFIG, held_ids, held_targets)
    figures = {
        "steps": STEPS, "batch": BATCH, "sequence": SEQ, "tokens_seen": STEPS * BATCH * SEQ,
        "optimizer": f"Adam betas (0.9, 0.99), lr {LR} after {WARMUP} warm-up steps, cosine to {LR_MIN}, "
                     "gradient clipped to norm 1",
        "init_seed": INIT_SEED, "data_seed": DATA_SEED,
        "train_tokens": int(split), "heldout_tokens": int(len(held)),
        "train_seconds": round(seconds, 1),
        "loss_first_step": round(losses[0], 4),
        "loss_last_25_steps_mean": round(float(np.mean(losses[-25:])), 4),
        "heldout_loss_initial": round(initial_heldout, 4),
        "heldout_loss": round(heldout, 4),
        "heldout_bits_per_byte": round(heldout / np.log(2), 3),
        "loss_unit": "mean cross-entropy in nats per token (byte)",
    }
    return params, figures


def _tensor_specs(cfg: Config) -> tuple[list[dict], list[dict]]:
    cache = ["N", cfg.heads, "P", cfg.head_dim]
    inputs: list[dict] = [
        {"name": "input_ids", "dtype": "int64", "shape": ["N", "S"], "values": "token ids, 0..256"},
        {"name": "positions", "dtype": "int64", "shape": ["N", "S"],
         "values": f"each token's position in its own sequence, 0..{cfg.context - 1}"},
        {"name": "attention_mask", "dtype": "int64", "shape": ["N", "P+S"],
         "values": "1 = attend to this cache column / new token, 0 = a hole or padding"},
    ]
    outputs: list[dict] = [{"name": "logits", "dtype": "float32", "shape": ["N", "S", cfg.vocab]}]
    for name in input_names(cfg)[3:]:
        inputs.append({"name": name, "dtype": "float32", "shape": cache,
                       "values": "the previous call's present_* (P = 0 for a fresh prefill)"})
    for name in output_names(cfg)[1:]:
        outputs.append({"name": name, "dtype": "float32", "shape": ["N", cfg.heads, "P+S", cfg.head_dim],
                        "values": "past with this call's keys/values appended along axis 2"})
    return inputs, outputs


def write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def build(out_dir: Path = HERE, log: Any = print) -> Path:
    files = training_files()
    stream = token_stream(files)
    text_sha = hashlib.sha256(stream.astype("<i8").tobytes()).hexdigest()
    params, figures = train(stream, log)
    model = build_graph(params, CONFIG, {"training_text_sha256": text_sha, "version": MODEL_VERSION})
    data = model.SerializeToString()
    onnx_path = out_dir / ONNX_NAME
    write_atomic(onnx_path, data)
    inputs, outputs = _tensor_specs(CONFIG)
    spec = {
        "name": MODEL_NAME,
        "version": MODEL_VERSION,
        "task": "text generation (greedy or sampled), byte level",
        "file": ONNX_NAME,
        "sha256": hashlib.sha256(data).hexdigest(),
        "size_bytes": len(data),
        "onnx_opset": OPSET,
        "onnx_ir_version": IR_VERSION,
        "licence": "Apache-2.0 (tidebatch's own licence, pyproject.toml): weights trained by "
                   "models/decoder/build.py on the project's own text",
        "source": {
            "training_text": [str(p.relative_to(REPO)) for p in files],
            "training_text_licence": "Apache-2.0: tidebatch's own documentation",
            "training_text_tokens": int(len(stream)),
            "training_text_sha256": text_sha,
            "build": "python -m models.decoder.build",
        },
        "architecture": {
            "type": "decoder-only transformer, pre-LayerNorm (GPT-2 shaped), tanh GELU, "
                    "learned absolute positions, output tied to the token embedding",
            "layers": CONFIG.layers, "d_model": CONFIG.d_model, "heads": CONFIG.heads,
            "head_dim": CONFIG.head_dim, "mlp": CONFIG.mlp, "context": CONFIG.context,
            "vocab": CONFIG.vocab, "parameters": n_params(params),
            "code": "models/decoder/numpy_model.py (numpy reference), models/decoder/export.py (graph)",
        },
        "tokenizer": {
            "kind": "UTF-8 bytes, no vocabulary file",
            "code": "models/decoder/tokenizer.py",
            "ids": "0..255 = the byte; 256 = end of text",
            "eos": tokenizer.EOS,
            "vocab": tokenizer.VOCAB,
        },
        "kv_cache": "explicit: past_key_i/past_value_i in, present_key_i/present_value_i out; "
                    "one graph for prefill (S = prompt, P = 0) and decoding (S = 1); rows at "
                    "different positions share a batch through positions and attention_mask",
        "inputs": inputs,
        "outputs": outputs,
        "training": figures,
    }
    write_atomic(out_dir / "spec.json", (json.dumps(spec, indent=2) + "\n").encode())
    return onnx_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=HERE,
                        help="where the ONNX file and spec.json go (default: models/decoder/)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    path = build(args.out_dir)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
