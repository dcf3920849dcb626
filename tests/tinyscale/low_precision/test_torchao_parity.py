"""Our Float8Linear against the library's: torchao's Float8Linear, emulated on CPU.

torchao is in the cluster extra (`make setup` installs it). Tensorwise, the two agree to
1e-6; torchao's rowwise recipe differs from ours by design (e4m3 gradients, power-of-two
scales), which the page says and the config check below pins.
"""

import pytest

pytest.importorskip("torchao", reason="torchao is in the cluster extra: make setup")


def test_tensorwise_equals_torchao() -> None:
    from tinyscale.low_precision.float8_linear import differences_from_torchao

    differences = differences_from_torchao()
    assert set(differences) == {"output", "grad input", "grad weight"}
    assert max(differences.values()) < 1e-6, differences


def test_torchaos_rowwise_recipe_is_what_the_page_says() -> None:
    import torch
    from torchao.float8 import Float8LinearConfig

    tensorwise = Float8LinearConfig()
    assert tensorwise.cast_config_grad_output.target_dtype == torch.float8_e5m2
    rowwise = Float8LinearConfig.from_recipe_name("rowwise")
    assert rowwise.cast_config_grad_output.target_dtype == torch.float8_e4m3fn
    assert rowwise.round_scales_to_power_of_2
