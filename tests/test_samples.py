"""Saved samples reproduce certify exactly; `widthscope stats` reads them and other scripts' Q
matrices; results files get the usual (umask) modes."""
from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest
import torch

from widthscope.cli import main


def _drop(res):
    # "options": how certify was run (certify --config repeats it); stats records its source instead
    return {k: v for k, v in res.items() if k not in ("timing", "source", "options")}


@pytest.mark.parametrize("extra", [[], ["--project", "8", "--interventions", "none"],
                                   ["--estimator", "plugin", "--K", "8"]])
def test_saved_samples_reproduce_the_certify_json(extra, tmp_path, capsys):
    out, smp = tmp_path / "c.json", tmp_path / "s.safetensors"
    rc = main(["certify", "--train-steps", "5", "--n-train", "64", "--n-test", "48", "--M", "8,16", "--draws", "200",
               "--out", str(out), "--save-samples", str(smp), *extra])
    assert rc == 0, capsys.readouterr().err
    rc = main(["stats", str(smp), "--out", str(tmp_path / "s.json")])
    assert rc == 0, capsys.readouterr().err
    a, b = json.loads(out.read_text()), json.loads((tmp_path / "s.json").read_text())
    assert _drop(a) == _drop(b)
    assert b["source"] == {"samples": str(smp)}
    # other settings without probing again: a different M changes the certificates, not the moments
    rc = main(["stats", str(smp), "--M", "4", "--draws", "50", "--out", str(tmp_path / "s4.json")])
    assert rc == 0
    c = json.loads((tmp_path / "s4.json").read_text())
    assert c["settings"]["M"] == [4] and c["settings"]["draws"] == 50
    assert c["points"][0]["moments_train"] == a["points"][0]["moments_train"]


def test_stats_reads_published_q_matrices_and_matches_the_api(tmp_path, capsys):
    from widthscope.certification import statistics

    g = torch.Generator().manual_seed(0)
    A = torch.randn(40, 6, generator=g, dtype=torch.float64) + 0.4
    B = torch.randn(30, 6, generator=g, dtype=torch.float64) + 0.4
    np.save(tmp_path / "q_train.npy", A.numpy())
    np.save(tmp_path / "q_val.npy", B.numpy())
    torch.save({"layer3": A.float(), "layer5": 2 * A.float()}, tmp_path / "tr.pt")
    torch.save({"layer3": B.float(), "layer5": 2 * B.float()}, tmp_path / "te.pt")
    rc = main(["stats", "--train", str(tmp_path / "q_train.npy"), "--test", str(tmp_path / "q_val.npy"),
               "--point", "layer3", "--M", "8,16", "--estimator", "plugin", "--out", str(tmp_path / "q.json")])
    assert rc == 0, capsys.readouterr().err
    res = json.loads((tmp_path / "q.json").read_text())
    want, _ = statistics({"layer3": A}, {"layer3": B}, pairs=[(8, 8), (16, 16)], estimator="plugin")
    assert res["points"] == want
    mu = A.mean(0)
    assert res["points"][0]["certificates"][0]["one"]["expectation"] == pytest.approx(float(mu @ mu))
    rc = main(["stats", "--train", str(tmp_path / "tr.pt"), "--test", str(tmp_path / "te.pt"), "--M", "8"])
    assert rc == 0 and "layer5" in capsys.readouterr().out
    np.save(tmp_path / "bad.npy", np.zeros((3, 4, 5)))
    rc = main(["stats", "--train", str(tmp_path / "bad.npy"), "--test", str(tmp_path / "q_val.npy")])
    err = capsys.readouterr().err
    assert rc == 2 and "(B, N)" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "x.safetensors").write_bytes(b"junk")
    rc = main(["stats", str(tmp_path / "x.safetensors")])
    assert rc == 2 and "samples" in capsys.readouterr().err


def test_results_files_respect_the_umask(tmp_path, capsys):
    old = os.umask(0o022)
    try:
        rc = main(["certify", "--train-steps", "2", "--n-train", "16", "--n-test", "16", "--M", "4",
                   "--draws", "20", "--interventions", "none", "--out", str(tmp_path / "c.json"),
                   "--save-samples", str(tmp_path / "s.safetensors")])
        assert rc == 0
        for f in ("c.json", "s.safetensors"):
            assert stat.S_IMODE((tmp_path / f).stat().st_mode) == 0o644
    finally:
        os.umask(old)


def test_unwritable_output_fails_before_any_work(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):  # root ignores permissions: use a path under a file instead
            target = tmp_path / "file" / "c.json"
            (tmp_path / "file").write_text("x")
        else:
            target = ro / "c.json"
        rc = main(["certify", "--train-steps", "100000", "--out", str(target)])
        cap = capsys.readouterr()
        assert rc == 2 and "cannot write" in cap.err and "builtin" not in cap.out  # no training happened
    finally:
        ro.chmod(0o700)
