"""The model names a cell may ask for, known without importing torch or torchvision.

The workflow checks every cell's model while it parses the Snakefile, and every
job parses it again: importing torchvision there would cost each of them about
3 s. TORCHVISION_MODELS is torchvision.models.list_models(module=torchvision.models)
of torchvision 0.29.2; tests/workflow/test_parse_speed.py compares it with the installed
torchvision, so the list cannot go stale silently. A leaf: it imports nothing of
feedbench, so the knob table (feedbench.core.knobs) can ask it without a cycle.
"""

from __future__ import annotations

# feedbench's own models (feedbench.harness.models builds them).
OWN_MODELS = ("none", "mlp", "sleep", "lstm")


def input_kind(model: str) -> str:
    """What samples the model eats: vector, tokens, or image (also for none/sleep); torch-free for
    predict."""
    return {"mlp": "vector", "lstm": "tokens"}.get(model, "image")


# Model families whose compute efficiency (achieved over peak FLOP/s) a compute estimate fits apart
# (feedbench.core.estimate): convolutions, recurrent layers, dense layers, attention.
FAMILIES = ("cnn", "rnn", "mlp", "transformer")
# torchvision's classification models built of attention blocks; every other one of
# TORCHVISION_MODELS is a CNN.
TRANSFORMER_PREFIXES = ("vit_", "swin_", "maxvit_")


def model_family(model: str) -> str | None:
    """The family of a model name for the compute estimate; None for none, sleep and the user's own
    models."""
    if model in ("mlp", "lstm"):
        return {"mlp": "mlp", "lstm": "rnn"}[model]
    if model in TORCHVISION_MODELS:
        return "transformer" if model.startswith(TRANSFORMER_PREFIXES) else "cnn"
    return None


# torchvision's classification models: torchvision.models.get_model builds them.
TORCHVISION_MODELS = (
    "alexnet",
    "convnext_base",
    "convnext_large",
    "convnext_small",
    "convnext_tiny",
    "densenet121",
    "densenet161",
    "densenet169",
    "densenet201",
    "efficientnet_b0",
    "efficientnet_b1",
    "efficientnet_b2",
    "efficientnet_b3",
    "efficientnet_b4",
    "efficientnet_b5",
    "efficientnet_b6",
    "efficientnet_b7",
    "efficientnet_v2_l",
    "efficientnet_v2_m",
    "efficientnet_v2_s",
    "googlenet",
    "inception_v3",
    "maxvit_t",
    "mnasnet0_5",
    "mnasnet0_75",
    "mnasnet1_0",
    "mnasnet1_3",
    "mobilenet_v2",
    "mobilenet_v3_large",
    "mobilenet_v3_small",
    "regnet_x_16gf",
    "regnet_x_1_6gf",
    "regnet_x_32gf",
    "regnet_x_3_2gf",
    "regnet_x_400mf",
    "regnet_x_800mf",
    "regnet_x_8gf",
    "regnet_y_128gf",
    "regnet_y_16gf",
    "regnet_y_1_6gf",
    "regnet_y_32gf",
    "regnet_y_3_2gf",
    "regnet_y_400mf",
    "regnet_y_800mf",
    "regnet_y_8gf",
    "resnet101",
    "resnet152",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnext101_32x8d",
    "resnext101_64x4d",
    "resnext50_32x4d",
    "shufflenet_v2_x0_5",
    "shufflenet_v2_x1_0",
    "shufflenet_v2_x1_5",
    "shufflenet_v2_x2_0",
    "squeezenet1_0",
    "squeezenet1_1",
    "swin_b",
    "swin_s",
    "swin_t",
    "swin_v2_b",
    "swin_v2_s",
    "swin_v2_t",
    "vgg11",
    "vgg11_bn",
    "vgg13",
    "vgg13_bn",
    "vgg16",
    "vgg16_bn",
    "vgg19",
    "vgg19_bn",
    "vit_b_16",
    "vit_b_32",
    "vit_h_14",
    "vit_l_16",
    "vit_l_32",
    "wide_resnet101_2",
    "wide_resnet50_2",
)


def model_error(name: str) -> str | None:
    """Why a cell cannot train a model of this name, in the knob table's words; None for ours and
    torchvision's."""
    if name in OWN_MODELS or name in TORCHVISION_MODELS:
        return None
    return (
        f"knob 'model': value {name!r} is not known; allowed: {', '.join(OWN_MODELS)} "
        f"or a torchvision classification model ({', '.join(TORCHVISION_MODELS[:6])}, ...)"
    )
