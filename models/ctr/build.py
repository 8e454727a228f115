"""Offline build of the shipped CTR model: ``python -m models.ctr.build``.

Writes models/ctr/ctr_deepfm.onnx and models/ctr/spec.json. torch is a build-only
tool here (the ``build`` extra); serving needs only numpy + onnxruntime.

Training data: a documented click model with a known ground truth
------------------------------------------------------------------
Impressions (context, item) are drawn from the synthetic Criteo-shaped world in
models/ctr/synth.py (Zipf users/items/categorical values, log-normal counts, missing
values). Each impression is clicked with probability sigmoid(z + eps):

    z = b0
      + sum_j  dense_j(x_j)                                    13 dense effects
      + sum_f  beta_f[v_f]                                     26 first-order value effects
      + sum_(f,g) in PAIRS  lambda_fg * <u_f[v_f], u_g[v_g]>   user-side x item-side FM terms
    eps ~ N(0, NOISE_SD^2)                                     unobserved heterogeneity

* dense_j(x) = w_j * l + q_j * l^2 with l = log1p(x) - mu_j (mu_j the field's
  log-normal location), and a per-field effect m_j instead when x_j is missing;
  w_j ~ N(0, 0.2^2), q_j ~ N(0, 0.04^2), m_j ~ N(0, 0.25^2).
* beta_f[v] ~ N(0, s_f^2) for every value rank v (missing is its own value), with
  s_f ~ U(0.05, 0.35) per field.
* u_f[v] in R^4 with i.i.d. N(0, 4^-1/2) components, so <u_f, u_g> has unit variance;
  PAIRS are 10 fixed (context field, item field) pairs with lambda ~ U(0.2, 0.45).
  A missing value has the zero vector.
* b0 is set (bisection on a calibration draw) so that the mean CTR is TARGET_CTR.

Every parameter is drawn from numpy's default_rng(CLICK_SEED). The Bayes-optimal
score from what the model can see is monotone in z (eps is independent noise), so
AUC(z) on the held-out rows is the ceiling any model can reach; the build reports it
next to the trained model's AUC.

Model: DeepFM (shared 2^16 x 16 embedding table, first-order weights, FM term, MLP
3 x 256 with ReLU). The dense transform log1p(clip(x, 0, 1e9)) with NaN -> 0, plus
13 missing flags, is part of the graph, so the ONNX takes raw counts; the logit is
clamped to +-15 so that the float32 probability never rounds to 0 or 1. One pass over
a fresh stream of TRAIN_ROWS impressions (no row is seen twice), batch 512,
SparseAdam for the embedding tables and Adam for the rest, 1 torch thread; the whole
build takes about 3 minutes on one core.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.ctr import features as F
from models.ctr import synth

HERE = Path(__file__).resolve().parent
ONNX_NAME = "ctr_deepfm.onnx"
MODEL_NAME = "ctr_deepfm"
MODEL_VERSION = "1.0.0"

DATA_SEED = 7
CLICK_SEED = 11
TORCH_SEED = 13
TARGET_CTR = 0.22
NOISE_SD = 0.5
LATENT_DIM = 4
PAIRS: tuple[tuple[str, str], ...] = (
    ("C1", "C14"),
    ("C1", "C17"),
    ("C2", "C16"),
    ("C5", "C14"),
    ("C6", "C23"),
    ("C8", "C15"),
    ("C9", "C20"),
    ("C11", "C18"),
    ("C13", "C24"),
    ("C3", "C21"),
)

TRAIN_ROWS = 2_048_000  # 4000 steps of 512; ~2 min on one thread
TEST_ROWS = 200_000
BATCH = 512
LR_EMBED = 2e-3  # SparseAdam on the two tables (a step touches only the rows in the batch)
LR_DENSE = 1e-3  # Adam on everything else
GEN_CHUNK = 500_000  # rows generated at a time, to bound the build's memory
EMBED_DIM = 16
HIDDEN = (256, 256, 256)  # 3x400 learnt no better in trials here and costs ~40 % more
OPSET = 17
LOGIT_CLAMP = 15.0  # prob in [3.1e-7, 1 - 3.1e-7]
IR_VERSION = 9


# ----------------------------------------------------------------------------- click model
@dataclass(slots=True)
class ClickModel:
    b0: float
    w: np.ndarray  # [13]
    q: np.ndarray  # [13]
    m: np.ndarray  # [13]
    mu: np.ndarray  # [13]
    beta: list[np.ndarray]  # per field: [vocab + 1], last entry = missing
    pairs: list[tuple[int, int, float]]
    latent: dict[int, np.ndarray]  # field -> [vocab + 1, LATENT_DIM], last row = 0 (missing)

    @classmethod
    def draw(cls, seed: int = CLICK_SEED) -> ClickModel:
        rng = np.random.default_rng(seed)
        w = rng.normal(0.0, 0.2, F.N_DENSE)
        q = rng.normal(0.0, 0.04, F.N_DENSE)
        m = rng.normal(0.0, 0.25, F.N_DENSE)
        mu = np.array([s.mu for s in synth.DENSE_SPECS])
        scales = rng.uniform(0.05, 0.35, F.N_CAT)
        beta = [rng.normal(0.0, scales[f], s.vocab + 1) for f, s in enumerate(synth.CAT_SPECS)]
        pairs: list[tuple[int, int, float]] = []
        latent: dict[int, np.ndarray] = {}
        for a, b in PAIRS:
            fa, fb = F.CAT_FIELDS.index(a), F.CAT_FIELDS.index(b)
            pairs.append((fa, fb, float(rng.uniform(0.2, 0.45))))
            for f in (fa, fb):
                if f not in latent:
                    vocab = synth.CAT_SPECS[f].vocab
                    table = rng.normal(0.0, LATENT_DIM**-0.25, (vocab + 1, LATENT_DIM))
                    table[vocab] = 0.0
                    latent[f] = table
        return cls(0.0, w, q, m, mu, beta, pairs, latent)

    def logit(self, rows: synth.Rows) -> np.ndarray:
        """z without b0 and without noise."""
        n = len(rows.users)
        z = np.zeros(n)
        missing = np.isnan(rows.dense)
        lx = np.log1p(np.where(missing, 0.0, rows.dense)) - self.mu
        z += np.where(missing, self.m, self.w * lx + self.q * lx * lx).sum(axis=1)
        for f, spec in enumerate(synth.CAT_SPECS):
            idx = np.where(rows.cat_ranks[:, f] < 0, spec.vocab, rows.cat_ranks[:, f])
            z += self.beta[f][idx]
        for fa, fb, lam in self.pairs:
            ia = np.where(
                rows.cat_ranks[:, fa] < 0, synth.CAT_SPECS[fa].vocab, rows.cat_ranks[:, fa]
            )
            ib = np.where(
                rows.cat_ranks[:, fb] < 0, synth.CAT_SPECS[fb].vocab, rows.cat_ranks[:, fb]
            )
            z += lam * np.einsum("nk,nk->n", self.latent[fa][ia], self.latent[fb][ib])
        return z

    def calibrate(self, z: np.ndarray, target: float) -> None:
        """Set b0 so that mean(sigmoid(b0 + z)) = target (bisection; mean is monotone in b0)."""
        lo, hi = -20.0, 20.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if _sigmoid(mid + z).mean() < target:
                lo = mid
            else:
                hi = mid
        self.b0 = 0.5 * (lo + hi)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def auc(y: np.ndarray, score: np.ndarray) -> float:
    """ROC AUC by the rank-sum (Mann-Whitney) formula, ties get average ranks."""
    order = np.argsort(score, kind="mergesort")
    s, yy = score[order], y[order].astype(bool)
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]
    n_pos = float(yy.sum())
    n_neg = float(len(yy)) - n_pos
    return float((ranks[yy].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def logloss(y: np.ndarray, p: np.ndarray) -> float:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-(y * np.log(p) + (1 - y) * np.log1p(-p)).mean())


@dataclass(slots=True)
class Dataset:
    dense: np.ndarray  # float32 [n,13] raw counts, NaN missing (the model's input)
    cat: np.ndarray  # int64 [n,26] hashed ids (the model's input)
    z: np.ndarray  # float64 [n] true logit incl. b0, without noise
    y: np.ndarray  # float32 [n] clicks


def make_dataset(
    world: synth.World, click: ClickModel, rng: np.random.Generator, n: int
) -> Dataset:
    parts = [_make_chunk(world, click, rng, min(GEN_CHUNK, n - i)) for i in range(0, n, GEN_CHUNK)]
    return Dataset(
        *(np.concatenate([getattr(p, k) for p in parts]) for k in ("dense", "cat", "z", "y"))
    )


def _make_chunk(world: synth.World, click: ClickModel, rng: np.random.Generator, n: int) -> Dataset:
    rows = synth.draw_rows(world, rng, n)
    z = click.b0 + click.logit(rows)
    y = (rng.random(n) < _sigmoid(z + rng.normal(0.0, NOISE_SD, n))).astype(np.float32)
    values = synth.token_values(np.arange(F.N_CAT), rows.cat_ranks)
    cat = F.hash_ids(values, rows.cat_ranks >= 0)  # the serving codec's hashing, same code
    return Dataset(rows.dense.astype(np.float32), cat, z, y)


# ----------------------------------------------------------------------------- model
def build_model(dense_mean: np.ndarray, dense_std: np.ndarray):  # -> torch.nn.Module
    import torch
    from torch import nn

    class DeepFM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(F.TABLE_SIZE, EMBED_DIM, sparse=True)
            self.first = nn.Embedding(F.TABLE_SIZE, 1, sparse=True)
            nn.init.normal_(self.emb.weight, std=0.01)
            nn.init.zeros_(self.first.weight)
            self.dense_first = nn.Linear(2 * F.N_DENSE, 1)
            # fixed standardisation of the 13 log counts, baked into the graph; the 13
            # missing flags stay 0/1 (a flag never set in training, e.g. I2's, would
            # otherwise be scaled by 1/std ~ infinity when a request does set it)
            self.register_buffer("d_mean", torch.tensor(dense_mean, dtype=torch.float32))
            self.register_buffer("d_std", torch.tensor(dense_std, dtype=torch.float32))
            layers: list[nn.Module] = []
            width = F.N_CAT * EMBED_DIM + 2 * F.N_DENSE
            for h in HIDDEN:
                layers += [nn.Linear(width, h), nn.ReLU()]
                width = h
            layers.append(nn.Linear(width, 1))
            self.mlp = nn.Sequential(*layers)

        def forward(self, dense: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
            missing = torch.isnan(dense)
            x = torch.log1p(torch.clamp(torch.where(missing, 0.0, dense), 0.0, F.DENSE_CLIP))
            d = torch.cat([(x - self.d_mean) / self.d_std, missing.to(torch.float32)], dim=1)
            e = self.emb(cat)  # [N, 26, 16]
            s = e.sum(dim=1)
            fm = 0.5 * (s * s - (e * e).sum(dim=1)).sum(dim=1)
            first = self.first(cat).sum(dim=(1, 2)) + self.dense_first(d)[:, 0]
            deep = self.mlp(torch.cat([e.flatten(1), d], dim=1))[:, 0]
            # float32 sigmoid rounds to exactly 1.0 above ~17: clamp so prob stays in (0, 1)
            return torch.sigmoid(torch.clamp(first + fm + deep, -LOGIT_CLAMP, LOGIT_CLAMP))

    return DeepFM()


def train(model, data: Dataset, log_every: int = 500) -> float:  # -> seconds
    import torch

    tables = [model.emb.weight, model.first.weight]
    rest = [p for name, p in model.named_parameters() if not name.startswith(("emb.", "first."))]
    opt_tables = torch.optim.SparseAdam(tables, lr=LR_EMBED)
    opt_rest = torch.optim.Adam(rest, lr=LR_DENSE)
    loss_fn = torch.nn.BCELoss()
    dense = torch.from_numpy(data.dense)
    cat = torch.from_numpy(data.cat)
    y = torch.from_numpy(data.y)
    n = len(data.y)
    steps = n // BATCH
    t0 = time.perf_counter()
    model.train()
    running = 0.0
    for step in range(steps):
        sl = slice(step * BATCH, (step + 1) * BATCH)
        opt_tables.zero_grad(set_to_none=True)
        opt_rest.zero_grad(set_to_none=True)
        loss = loss_fn(model(dense[sl], cat[sl]), y[sl])
        loss.backward()
        opt_tables.step()
        opt_rest.step()
        running += loss.item()
        if (step + 1) % log_every == 0:
            print(
                f"  step {step + 1}/{steps}  loss {running / log_every:.4f}  "
                f"{time.perf_counter() - t0:.0f}s",
                flush=True,
            )
            running = 0.0
    return time.perf_counter() - t0


def export_onnx(model, path: Path) -> None:
    import onnx
    import torch

    model.eval()
    dense = torch.zeros(4, F.N_DENSE, dtype=torch.float32)
    cat = torch.zeros(4, F.N_CAT, dtype=torch.int64)
    torch.onnx.export(
        model,
        (dense, cat),
        str(path),
        dynamo=False,
        opset_version=OPSET,
        input_names=["dense", "cat"],
        output_names=["prob"],
        dynamic_axes={"dense": {0: "N"}, "cat": {0: "N"}, "prob": {0: "N"}},
    )
    proto = onnx.load(str(path))
    proto.ir_version = IR_VERSION  # onnx 1.23 writes IR 14, which ONNX Runtime 1.31 refuses
    proto.producer_name = "tidebatch models.ctr.build"
    proto.doc_string = "Criteo-shaped DeepFM trained on a synthetic click model; see spec.json"
    for key, value in (("name", MODEL_NAME), ("version", MODEL_VERSION)):
        prop = proto.metadata_props.add()
        prop.key, prop.value = key, value
    onnx.checker.check_model(proto)
    onnx.save(proto, str(path))


def onnx_scores(path: Path, data: Dataset) -> np.ndarray:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    out = [
        sess.run(["prob"], {"dense": data.dense[i : i + 8192], "cat": data.cat[i : i + 8192]})[0]
        for i in range(0, len(data.y), 8192)
    ]
    return np.concatenate(out)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_spec(path: Path, onnx_path: Path, click: ClickModel, metrics: dict) -> None:
    spec = {
        "name": MODEL_NAME,
        "version": MODEL_VERSION,
        "file": onnx_path.name,
        "sha256": sha256(onnx_path),
        "onnx_opset": OPSET,
        "onnx_ir_version": IR_VERSION,
        "codec": "ctr",
        "inputs": [
            {
                "name": "dense",
                "dtype": "float32",
                "shape": ["N", F.N_DENSE],
                "fields": list(F.DENSE_FIELDS),
                "meaning": "raw counts, NaN = missing; transformed in the graph",
                "range": [0.0, 1000.0],
            },
            {
                "name": "cat",
                "dtype": "int64",
                "shape": ["N", F.N_CAT],
                "fields": list(F.CAT_FIELDS),
                "meaning": "hashed categorical ids (see hashing)",
                "range": [0, F.TABLE_SIZE - 1],
            },
        ],
        "outputs": [
            {"name": "prob", "dtype": "float32", "shape": ["N"], "meaning": "click probability"}
        ],
        "features": {
            "context": {"dense": list(F.CONTEXT_DENSE), "cat": list(F.CONTEXT_CAT)},
            "item": {"id": "item_id", "dense": list(F.ITEM_DENSE), "cat": list(F.ITEM_CAT)},
            "dense_transform": (
                "in graph: x' = log1p(clip(x, 0, 1e9)) with NaN -> 0, plus a 0/1 missing flag "
                "per field; the 13 log counts are standardised with constants fixed at build time; "
                "the output logit is clamped to +-15 so prob stays strictly inside (0, 1)"
            ),
            "dense_clip": F.DENSE_CLIP,
        },
        "hashing": {
            "code": "models/ctr/features.py: parse_tokens + hash_ids",
            "token": "1..16 ASCII hex digits (Criteo: 8), value v = int(token, 16)",
            "formula": (
                "h = ((v ^ salt[f]) * 0x9E3779B97F4A7C15 mod 2^64) >> 32; "
                "id = n_reserved + ((h * (table_size - n_reserved)) >> 32)"
            ),
            "table_size": F.TABLE_SIZE,
            "n_reserved": F.N_RESERVED,
            "missing_id": "field index f (0..25)",
            "multiplier": hex(F.HASH_MULTIPLIER),
            "salt_seed": hex(F.SALT_SEED),
            "salts": [hex(int(s)) for s in F.FIELD_SALTS],
        },
        "architecture": {
            "type": "DeepFM",
            "embedding_dim": EMBED_DIM,
            "mlp": list(HIDDEN),
            "shared_table": True,
        },
        "training": {
            "click_model": (
                "p(click) = sigmoid(z + eps), z = b0 + sum_j dense_j(x_j) + sum_f beta_f[v_f] "
                "+ sum_(f,g) lambda_fg <u_f[v_f], u_g[v_g]>, eps ~ N(0, noise_sd^2); "
                "see models/ctr/build.py docstring"
            ),
            "world": "models/ctr/synth.py (Zipf users/items/values, log-normal counts)",
            "world_seed": synth.WORLD_SEED,
            "click_seed": CLICK_SEED,
            "data_seed": DATA_SEED,
            "torch_seed": TORCH_SEED,
            "b0": round(click.b0, 6),
            "noise_sd": NOISE_SD,
            "latent_dim": LATENT_DIM,
            "pairs": [
                [F.CAT_FIELDS[a], F.CAT_FIELDS[b], round(lam, 6)] for a, b, lam in click.pairs
            ],
            "target_ctr": TARGET_CTR,
            "test_rows": TEST_ROWS,
            "epochs": 1,
            "batch": BATCH,
            "optimizer": f"SparseAdam lr={LR_EMBED} (tables), Adam lr={LR_DENSE} (rest)",
            **metrics,
        },
    }
    path.write_text(json.dumps(spec, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-rows", type=int, default=TRAIN_ROWS)
    parser.add_argument("--out", type=Path, default=HERE, help="directory for .onnx + spec.json")
    args = parser.parse_args(argv)
    train_rows = args.train_rows

    import torch

    torch.set_num_threads(1)  # 2 threads under load were 3x slower (docs/MODELS.md)
    torch.manual_seed(TORCH_SEED)
    t_start = time.perf_counter()

    world = synth.World()
    click = ClickModel.draw(CLICK_SEED)
    calib_rows = synth.draw_rows(world, np.random.default_rng([DATA_SEED, 0]), 100_000)
    click.calibrate(click.logit(calib_rows), TARGET_CTR)
    train_set = make_dataset(world, click, np.random.default_rng([DATA_SEED, 1]), train_rows)
    test_set = make_dataset(world, click, np.random.default_rng([DATA_SEED, 2]), TEST_ROWS)
    print(
        f"data: {train_rows} train / {TEST_ROWS} test rows, CTR {train_set.y.mean():.4f}, "
        f"b0 {click.b0:.3f}, {time.perf_counter() - t_start:.0f}s",
        flush=True,
    )

    log_counts = F.dense_transform(train_set.dense[:200_000])[:, : F.N_DENSE]
    model = build_model(log_counts.mean(axis=0), np.maximum(log_counts.std(axis=0), 0.1))
    train_s = train(model, train_set)

    args.out.mkdir(parents=True, exist_ok=True)
    onnx_path = args.out / ONNX_NAME
    export_onnx(model, onnx_path)
    with torch.no_grad():
        model.eval()
        torch_p = model(
            torch.from_numpy(test_set.dense[:4096]), torch.from_numpy(test_set.cat[:4096])
        )
    p = onnx_scores(onnx_path, test_set)
    max_diff = float(np.abs(p[:4096] - torch_p.numpy()).max())
    true_p = _sigmoid(test_set.z)
    metrics = {
        "train_rows": train_rows,
        "train_seconds": round(train_s, 1),
        "heldout_ctr": round(float(test_set.y.mean()), 5),
        "heldout_auc_model": round(auc(test_set.y, p), 5),
        "heldout_auc_click_model": round(auc(test_set.y, true_p), 5),
        "heldout_logloss_model": round(logloss(test_set.y, p), 5),
        "heldout_logloss_click_model": round(logloss(test_set.y, true_p), 5),
        "onnx_vs_torch_max_abs_diff": max_diff,
    }
    write_spec(args.out / "spec.json", onnx_path, click, metrics)
    size_mb = onnx_path.stat().st_size / 1e6
    print(
        f"held-out AUC: model {metrics['heldout_auc_model']:.4f}, "
        f"click model (ceiling) {metrics['heldout_auc_click_model']:.4f}; "
        f"logloss {metrics['heldout_logloss_model']:.4f} vs {metrics['heldout_logloss_click_model']:.4f}"
    )
    print(
        f"wrote {onnx_path} ({size_mb:.1f} MB, onnx vs torch max diff {max_diff:.2e}) "
        f"and spec.json in {time.perf_counter() - t_start:.0f}s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
