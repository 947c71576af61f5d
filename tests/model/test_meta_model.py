"""A model on the meta device (`build_on_meta`, `meta_model`): the shapes of GPT(config), built
without torch's Python meta kernels, whose first use imports hundreds of modules into a process."""

import subprocess
import sys

import torch

from headlab.model.config import preset
from headlab.model.gpt import GPT, build_on_meta, count_parameters, meta_model, state_shapes
from headlab.schema import FAMILIES


def test_the_meta_model_has_every_tensor_of_the_model_in_its_shape_and_no_values():
    for family in FAMILIES:
        config = preset("tiny", family)
        built, meta = GPT(config), build_on_meta(config)
        assert state_shapes(config) == {name: tuple(t.shape) for name, t in built.state_dict().items()}
        assert all(p.is_meta for p in meta.parameters()) and meta.rope_cos.is_meta
        assert count_parameters(config) == built.param_counts()
        assert meta_model(config) is meta_model(config)


def test_counting_a_models_parameters_loads_no_python_meta_kernels():
    """In a fresh process: before, the first meta-device op imported ~800 modules (sympy, torch._refs...)."""
    code = ("import sys, torch\nfrom headlab.model.config import preset\n"
            "from headlab.model.gpt import count_parameters\nbefore = set(sys.modules)\n"
            "count_parameters(preset('paper-128m', 'mla'))\n"
            "print(len(set(sys.modules) - before))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert int(loaded) < 20, loaded


def test_a_model_built_under_a_device_context_has_its_rope_tables_there():
    with torch.device("meta"):
        model = GPT(preset("tiny", "mha"))
    assert model.rope_cos.is_meta and model.rope_sin.is_meta
