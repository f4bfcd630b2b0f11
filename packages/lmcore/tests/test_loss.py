"""Cross-entropy against torch's, including huge logits, leading dimensions and gradients."""

import pytest
import torch
import torch.nn.functional as F

from lmcore import cross_entropy


def _torch_reference(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.double().flatten(0, -2), targets.flatten())


@pytest.mark.parametrize("shape", [(13, 29), (2, 5, 31), (2, 3, 4, 7)])
def test_matches_torch_with_gradients(shape):
    torch.manual_seed(0)
    logits = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, shape[-1], shape[:-1])
    reference_logits = logits.detach().clone().requires_grad_()
    loss, expected = cross_entropy(logits, targets), _torch_reference(reference_logits, targets)
    loss.backward()
    expected.backward()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(logits.grad, reference_logits.grad)


def test_huge_logits_stay_finite_and_exact():
    torch.manual_seed(0)
    logits = (torch.randn(6, 4, 50) * 1e4).requires_grad_()  # exp(1e4) overflows any float
    targets = torch.randint(0, 50, (6, 4))
    loss = cross_entropy(logits, targets)
    loss.backward()
    reference_logits = logits.detach().double().requires_grad_()
    expected = _torch_reference(reference_logits, targets)
    expected.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()
    # Float32 logits of size 1e4 carry an absolute rounding of about 1e4 · 2^-24 ≈ 6e-4.
    torch.testing.assert_close(loss.double(), expected, rtol=1e-6, atol=1e-3)
    torch.testing.assert_close(logits.grad, reference_logits.grad.float())


def test_bf16_logits_are_computed_in_float32():
    torch.manual_seed(0)
    logits = torch.randn(8, 40).to(torch.bfloat16)
    targets = torch.randint(0, 40, (8,))
    loss = cross_entropy(logits, targets)
    assert loss.dtype == torch.float32
    # The inputs are bf16 already: only the float32 arithmetic differs from the float64 result.
    torch.testing.assert_close(loss.double(), _torch_reference(logits, targets))


def test_shape_mismatch_is_rejected():
    with pytest.raises(ValueError, match="shape of logits"):
        cross_entropy(torch.randn(4, 10), torch.randint(0, 10, (5,)))


def test_float_targets_are_rejected():
    with pytest.raises(TypeError, match="integer"):
        cross_entropy(torch.randn(4, 10), torch.rand(4))
