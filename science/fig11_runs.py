"""Measuring our own trained runs in every candidate view of Fig. 11 (`headlab.analysis.candidates`), for
`science/fig11_measures.py`: per run, at its final weights and at its step-0 snapshot (random
initialisation), every layer's λ₁ and effective rank per view and kind, and the uncentred spectrum at
the panel layers. The views that run the model read the study's own validation windows (32 for the
input moments, 8 for the attention maps, as `headlab reproduce` does); the data-aware view of the
step-0 weights uses the trained model's moments (what the inputs alone make of the initial forms).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
from real_measure import spectra_of
from regime_runs import finished_run

from headlab.analysis.attention_maps import attention_similarity
from headlab.analysis.candidates import data_aware_similarity, weight_candidates
from headlab.analysis.heads import load_heads
from headlab.analysis.inputs import input_moments
from headlab.analysis.snapshots import snapshot_heads
from headlab.analysis.spectrum import entropy_effective_rank
from headlab.data.corpus import load_corpus
from headlab.report.plots.panels import layer_roles
from headlab.study.roles import comparison_roles
from headlab.study.tables import BEHAVIOUR_WINDOWS, MOMENT_WINDOWS, validation_windows

SPECTRUM_COLUMNS = [f"l{i}" for i in range(1, 7)]


def attention_matrices(model, windows, label: str, n_heads: int) -> list[np.ndarray]:
    """Each layer's H × H attention-map similarity (1 − mean Jensen–Shannon distance)."""
    table = attention_similarity(model, windows, label)
    out = []
    for layer in sorted(table["layer"].unique()):
        at = table[table["layer"] == layer]
        matrix = np.zeros((n_heads, n_heads))
        matrix[at["head_i"].to_numpy(), at["head_j"].to_numpy()] = at["value"].to_numpy()
        out.append(matrix)
    return out


def run_rows(run_dir: Path, roles: dict[str, str], corpus) -> tuple[list[dict], list[dict]] | None:
    """(per-layer rows, panel spectrum rows) of one finished run; None while it trains."""
    run = finished_run(run_dir)
    if run is None:
        return None
    config = run.model_config
    windows = validation_windows(corpus, MOMENT_WINDOWS, config.seq_len)
    moments = input_moments(run.model, windows)
    maps = attention_matrices(run.model, validation_windows(corpus, BEHAVIOUR_WINDOWS, config.seq_len),
                              config.label, config.n_head)
    trained, init = load_heads(run.model), snapshot_heads(run_dir, 0)
    panels = {layer: name for name, layer in layer_roles(range(config.n_layer)).items()}
    seed = int(run_dir.name.rsplit("-seed", 1)[1])
    val_loss = run.val_losses()[-1]["val_loss"]
    layers, spectra = [], []
    for layer in range(config.n_layer):
        roots = moments.roots(layer)
        states = {"trained": {**weight_candidates(trained.layer(layer)),
                              "data-aware": data_aware_similarity(trained.layer(layer), roots),
                              "attention maps": maps[layer]}}
        if init is not None:
            states["init"] = {**weight_candidates(init.layer(layer)),
                              "data-aware": data_aware_similarity(init.layer(layer), roots)}
        for state, matrices in states.items():
            for (measure, kind), (values, negative) in spectra_of(matrices).items():
                here = {"role": roles[config.label], "model": config.label, "seed": seed, "layer": layer,
                        "panel": panels.get(layer, ""), "state": state, "measure": measure, "kind": kind}
                layers.append({**here, "val_loss": val_loss, "n_heads": values.size, "lambda1": values[0],
                               "lambda2": values[1], "er_pct": 100.0 * entropy_effective_rank(values) / values.size,
                               "negative_mass": negative})
                if here["panel"] and kind == "uncentered":
                    spectra.append({**here, **dict(zip(SPECTRUM_COLUMNS, values))})
    return layers, spectra


def study_rows(name: str, folder: Path, preset: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every finished run of the study in `folder` (trained with `preset`'s six variants)."""
    roles = {config.label: role for role, config in comparison_roles(preset).items()}
    corpus = load_corpus("shakespeare", "byte")
    layers, spectra = [], []
    for run_dir in sorted((folder / "runs").glob("*-seed*")):
        rows = run_rows(run_dir, roles, corpus)
        if rows is None:
            print(f"  {name}/{run_dir.name}: not finished, left out", file=sys.stderr)
            continue
        layers += rows[0]
        spectra += rows[1]
        print(f"  {name}/{run_dir.name}", file=sys.stderr)
    return pd.DataFrame(layers).assign(study=name), pd.DataFrame(spectra).assign(study=name)
