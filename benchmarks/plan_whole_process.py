"""``--plan`` against the whole process: ``certify --plan`` and ``grow --plan`` beside the real run
measured by ``/usr/bin/time -v`` (wall clock, maximum resident set size), on two checkpoints of
architectures the plan was not tuned on (a GPT-NeoX of hidden 128, a GPT-2 of n_embd 192; 4 layers,
random init, a byte-level BPE tokenizer trained on the text), text from the standard library's
source. One row per (model, command) in ``benchmarks/results/plan_whole_process.jsonl``:
``predicted_s`` / ``measured_s``, ``predicted_rss`` / ``measured_rss`` and their ratios.

    python benchmarks/plan_whole_process.py [--out benchmarks/results/plan_whole_process.jsonl]

Each run is small (under a minute); the runs go one after the other, with one torch thread.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {
    "certify": ["--n-train", "128", "--n-test", "128", "--seq-len", "64", "--batch-size", "16"],
    "grow": ["--n-train", "256", "--n-test", "128", "--seq-len", "64", "--steps", "30", "--M", "32", "--K", "32"],
}


def build(directory: Path, arch: str, text: str) -> None:
    """A random-init checkpoint of ``arch`` with a byte-level BPE trained on ``text``."""
    import torch
    import transformers as tf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        special_tokens=["<|pad|>", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(text.splitlines()[:20000], trainer=trainer)
    tok = tf.PreTrainedTokenizerFast(
        tokenizer_object=tk,
        pad_token="<|pad|>",
        eos_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    vocab = len(tok)
    if arch == "gpt_neox":
        cfg: object = tf.GPTNeoXConfig(
            vocab_size=vocab, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
            intermediate_size=512, max_position_embeddings=256, bos_token_id=1, eos_token_id=1,
        )  # fmt: skip
        model = tf.GPTNeoXForCausalLM(cfg)
    else:
        cfg = tf.GPT2Config(vocab_size=vocab, n_embd=192, n_layer=4, n_head=4, n_positions=256, bos_token_id=1, eos_token_id=1)
        model = tf.GPT2LMHeadModel(cfg)
    torch.manual_seed(0)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)


def stdlib_text(limit: int = 2_000_000) -> str:
    """Python's own standard library source, concatenated (a local text file of some size)."""
    import sysconfig

    lib = Path(sysconfig.get_paths()["stdlib"])
    out, size = [], 0
    for f in sorted(lib.glob("*.py")):
        t = f.read_text(encoding="utf-8", errors="replace")
        out.append(t)
        size += len(t)
        if size > limit:
            break
    return "\n\n".join(out)


def _cli(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "widthscope", *args]


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _size(text: str) -> int:
    """A human size of ``format_table`` ('12.3 MiB') in bytes."""
    m = re.match(r"([\d.]+)\s*([KMGT]?i?B)", text.strip())
    if not m:
        raise ValueError(f"not a size: {text!r}")
    unit = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 1e3, "MB": 1e6, "GB": 1e9}
    return int(float(m.group(1)) * unit[m.group(2)])


def _plan_row(out: str, what: str) -> str:
    for line in out.splitlines():
        if what in line:
            return line.split(what, 1)[1].strip(" |")
    raise ValueError(f"{what!r} not in the plan:\n{out}")


def plan_and_run(plan_argv: list[str], run_argv: list[str], last: bool = False) -> dict[str, object]:
    """``plan_argv`` (a ``--plan``) and then ``run_argv`` under ``/usr/bin/time -v``: predicted and
    measured wall time and peak RSS with their ratios (``last``: the plan's last total, for plans
    that print one per part)."""
    t0 = time.perf_counter()
    plan = subprocess.run(_cli(plan_argv), env=_env(), capture_output=True, text=True, check=True)
    plan_s = time.perf_counter() - t0
    text = "\n".join(reversed(plan.stdout.splitlines())) if last else plan.stdout
    predicted_s = float(_plan_row(text, "predicted wall time (whole process)").split()[0])
    rss = _size(_plan_row(text, "predicted peak memory (whole process, RSS)"))
    run = subprocess.run(["/usr/bin/time", "-v", *_cli(run_argv)], env=_env(), capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(run.stderr[-3000:])
    wall = _plan_row(run.stderr, "Elapsed (wall clock) time (h:mm:ss or m:ss):")
    parts = [float(p) for p in wall.split(":")]
    measured_s = sum(p * 60**i for i, p in enumerate(reversed(parts)))
    measured_rss = int(_plan_row(run.stderr, "Maximum resident set size (kbytes):")) * 1024
    return {
        "predicted_s": round(predicted_s, 2),
        "measured_s": round(measured_s, 2),
        "time_ratio": round(measured_s / predicted_s, 2),
        "predicted_rss_mib": round(rss / 2**20, 1),
        "measured_rss_mib": round(measured_rss / 2**20, 1),
        "rss_ratio": round(measured_rss / rss, 2),
        "plan_s": round(plan_s, 2),
    }


def measure(command: str, model: Path, data: Path, work: Path) -> dict[str, object]:
    base = [command, "--model", str(model), "--data", str(data), *COMMANDS[command]]
    out = work / f"{model.name}-{command}.json"
    return {
        "model": model.name,
        "command": command,
        "args": COMMANDS[command],
        **plan_and_run([*base, "--plan"], [*base, "--out", str(out)]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "plan_whole_process.jsonl"))
    ap.add_argument("--only", default=None, help="one model: gpt_neox or gpt2")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = work / "stdlib.txt"
        text = stdlib_text()
        data.write_text(text, encoding="utf-8")
        for arch in ("gpt_neox", "gpt2"):
            if args.only and arch != args.only:
                continue
            model = work / f"{arch}-w{128 if arch == 'gpt_neox' else 192}"
            build(model, arch, text)
            for command in COMMANDS:
                row = measure(command, model, data, work)
                print(json.dumps(row), flush=True)
                rows.append(row)
    out = Path(args.out)
    if args.only and out.is_file():  # the other model's rows are kept
        kept = [json.loads(ln) for ln in out.read_text(encoding="utf-8").splitlines() if ln.strip()]
        rows = [r for r in kept if not r["model"].startswith(args.only + "-")] + rows
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
