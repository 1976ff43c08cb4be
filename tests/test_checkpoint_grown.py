"""A grown model (inserted bias/block) saves and loads with its new parameters."""
import torch

from widthscope import checkpoint
from widthscope.models import build
from widthscope.probe.insert import insert


def test_grown_model_round_trip(tmp_path):
    torch.manual_seed(0)
    m = build("mlp", 16, in_dim=5, out_dim=3, depth=2).eval()
    x = torch.randn(7, 5)
    m = insert(m, m.widthscope_points[0], kind="block", hidden=8)
    m = insert(m, m.widthscope_points[1], kind="bias")
    with torch.no_grad():  # move off the zero init so the round trip is not trivially equal
        for name, p in m.named_parameters():
            if "widthscope_insert" in name:
                p.add_(0.1 * torch.randn_like(p))
    y = m(x)
    checkpoint.save(m, tmp_path / "ckpt")
    m2 = checkpoint.load(tmp_path / "ckpt")
    assert torch.allclose(m2(x), y, atol=1e-6)
    assert len(m2.widthscope_config["insertions"]) == 2
