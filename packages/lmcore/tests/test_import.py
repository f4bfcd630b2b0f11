"""`import lmcore` needs no torch: the sizes and configurations are plain Python, and every other
public name is imported from its module on first use."""

from fresh_interpreter import run_fresh
from lazy_package import check_lazy_package

import lmcore
import lmcore.backends


def test_import_lmcore_and_its_sizes_import_no_torch_and_every_name_is_there():
    check_lazy_package(
        lmcore,
        light_use="config = lmcore.model_config('small', context_length=256)\n"
        "lmcore.count_parameters(config), sorted(lmcore.MODEL_SIZES), lmcore.attention_names()\n"
        "lmcore.ActivationCheckpointing.parse('nested').plan(config.num_layers)",
    )


def test_the_builtin_attention_names_are_the_registered_backends():
    builtin = lmcore.BUILTIN_ATTENTION
    assert builtin == tuple(lmcore.ATTENTION_BACKENDS)[: len(builtin)]
    assert lmcore.get_attention("naive") is lmcore.backends.naive_attention
    assert lmcore.get_attention("sdpa") is lmcore.backends.sdpa_attention
    assert lmcore.get_attention("fa2-pytorch") is lmcore.backends.fa2_pytorch_attention
    assert lmcore.get_attention("fa2-triton") is lmcore.backends.fa2_triton_attention


def test_attention_names_are_the_registered_backends_with_or_without_torch():
    run = run_fresh("import lmcore\nprint(lmcore.attention_names())")
    assert not run.loaded
    assert run.stdout.strip() == str(lmcore.BUILTIN_ATTENTION)
    assert lmcore.attention_names() == tuple(lmcore.ATTENTION_BACKENDS)
