"""The studies' own models: mlp_style ray builds Ray's benchmark MLP (square layers, no
activation)."""

from __future__ import annotations

import pytest
from feedbench.core.cell import parse_cell
from feedbench.core.knobs import KnobError
from feedbench.harness.models import build_model
from torch import nn


@pytest.mark.parametrize("layers", [1, 4, 8])
def test_ray_style_is_hidden_layers_square_linears_and_an_output(layers):
    model = build_model(
        parse_cell(
            {
                "model": "mlp",
                "mlp_style": "ray",
                "input_size": 64,
                "width": 64,
                "hidden_layers": layers,
            }
        )
    )
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(64, 64)] * layers + [(64, 1)]
    assert not any(isinstance(m, nn.ReLU) for m in model.modules())


def test_relu_style_keeps_the_input_layer_and_activations():
    model = build_model(
        parse_cell({"model": "mlp", "input_size": 64, "width": 64, "hidden_layers": 1})
    )
    assert sum(isinstance(m, nn.Linear) for m in model.modules()) == 3
    assert sum(isinstance(m, nn.ReLU) for m in model.modules()) == 2


def test_a_bad_mlp_style_is_one_line_naming_the_choices():
    with pytest.raises(
        KnobError, match=r"knob 'mlp_style': value 'gelu' is not allowed; " r"allowed: relu, ray"
    ):
        parse_cell({"mlp_style": "gelu"})
