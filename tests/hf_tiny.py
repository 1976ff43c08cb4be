"""Tiny Hugging Face checkpoints for the tests: a model of each architecture built from a config,
saved with ``save_pretrained``, a word-level tokenizer built with ``tokenizers`` saved beside it,
and small text/image datasets in the usual file formats. Nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import torch

WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but "
    "have an they you were her she there been one all we their has would when if so no will more can "
    "who some into them could time only new these two may first then do any like my now over such "
    "our man me even most made after also did many before must through back years where much your way "
    "well down should because each just those people how too little state good very make world still "
    "own see men work long get here between both life being under never day same another know while "
    "last might us great old year off come since against go came right used take three"
).split()


def corpus(n_docs: int, seed: int = 0, words: int = 40) -> list[str]:
    """Seeded pseudo-English documents over a fixed vocabulary."""
    g = torch.Generator().manual_seed(seed)
    docs = []
    for _ in range(n_docs):
        n = int(torch.randint(words // 2, words * 2, (1,), generator=g))
        idx = torch.randint(0, len(WORDS), (n,), generator=g).tolist()
        docs.append(" ".join(WORDS[i] for i in idx) + ".")
    return docs


def save_tokenizer(directory: Path, *, masked: bool = False):
    """Causal models: a byte-level BPE trained on :func:`corpus` text (as GPT-2/Llama-3/Qwen
    tokenizers are); masked: a WordLevel tokenizer with BERT's specials. Saved with
    ``save_pretrained`` as a fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if masked:
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        vocab = {t: i for i, t in enumerate(specials + sorted(set(WORDS)) + ["."])}
        tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
        tk.pre_tokenizer = pre_tokenizers.Whitespace()
        tk.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
        )
        tok = PreTrainedTokenizerFast(
            tokenizer_object=tk,
            pad_token="[PAD]",
            unk_token="[UNK]",
            cls_token="[CLS]",
            sep_token="[SEP]",
            mask_token="[MASK]",
        )
    else:
        tk = Tokenizer(models.BPE())
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=["<|pad|>", "<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tk.train_from_iterator(corpus(300, seed=99), trainer=trainer)
        tok = PreTrainedTokenizerFast(
            tokenizer_object=tk,
            pad_token="<|pad|>",
            eos_token="<|endoftext|>",
            bos_token="<|endoftext|>",
            unk_token="<|endoftext|>",
        )
    tok.save_pretrained(directory)
    return tok


def _cfg(arch: str, vocab: int):
    import transformers as tf

    h, L, heads, ffn = 32, 2, 2, 64
    common = dict(
        vocab_size=vocab,
        hidden_size=h,
        num_hidden_layers=L,
        num_attention_heads=heads,
        intermediate_size=ffn,
        max_position_embeddings=128,
        pad_token_id=0,
    )
    if arch == "llama":
        return tf.LlamaConfig(**common, num_key_value_heads=1), tf.LlamaForCausalLM
    if arch == "gpt_neox":
        return tf.GPTNeoXConfig(**common), tf.GPTNeoXForCausalLM
    if arch == "gpt2":
        return tf.GPT2Config(
            vocab_size=vocab, n_embd=h, n_layer=L, n_head=heads, n_positions=128, bos_token_id=1, eos_token_id=1
        ), tf.GPT2LMHeadModel
    if arch == "qwen2":
        return tf.Qwen2Config(**common, num_key_value_heads=1), tf.Qwen2ForCausalLM
    if arch == "mistral":
        return tf.MistralConfig(**common, num_key_value_heads=1, sliding_window=None), tf.MistralForCausalLM
    if arch == "phi3":
        return tf.Phi3Config(**common, num_key_value_heads=1, bos_token_id=1, eos_token_id=1), tf.Phi3ForCausalLM
    if arch == "gemma":
        return tf.GemmaConfig(**common, num_key_value_heads=1, head_dim=16), tf.GemmaForCausalLM
    if arch == "opt":
        return tf.OPTConfig(
            vocab_size=vocab,
            hidden_size=h,
            num_hidden_layers=L,
            num_attention_heads=heads,
            ffn_dim=ffn,
            max_position_embeddings=128,
            word_embed_proj_dim=h,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=1,
        ), tf.OPTForCausalLM
    if arch == "bert":
        return tf.BertConfig(**common), tf.BertForMaskedLM
    if arch == "bert-cls":
        return tf.BertConfig(**common, num_labels=3), tf.BertForSequenceClassification
    raise KeyError(arch)


CAUSAL = ("llama", "gpt_neox", "gpt2", "qwen2", "mistral", "phi3", "gemma", "opt")


def save_model(directory: Path, arch: str, *, seed: int = 0) -> Path:
    """A tiny ``arch`` model with its tokenizer in ``directory``; returns the directory."""
    directory = Path(directory)
    masked = arch.startswith("bert")
    tok = save_tokenizer(directory, masked=masked)
    cfg, cls = _cfg(arch, len(tok))
    torch.manual_seed(seed)
    cls(cfg).save_pretrained(directory)
    return directory


def save_vit(directory: Path, *, seed: int = 0, num_labels: int = 3) -> Path:
    import transformers as tf

    cfg = tf.ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=16,
        patch_size=4,
        num_labels=num_labels,
    )
    torch.manual_seed(seed)
    tf.ViTForImageClassification(cfg).save_pretrained(directory)
    proc = tf.AutoImageProcessor.for_model("vit") if hasattr(tf.AutoImageProcessor, "for_model") else None
    if proc is None:
        from transformers import ViTImageProcessor

        proc = ViTImageProcessor(size={"height": 16, "width": 16})
    else:
        proc.size = {"height": 16, "width": 16}
    proc.save_pretrained(directory)
    return Path(directory)


def image_folder(root: Path, *, classes: int = 3, per_class: int = 8, seed: int = 0, size: int = 20) -> Path:
    """ImageFolder layout: root/<class>/<i>.png with seeded colour blobs per class."""
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    for c in range(classes):
        d = Path(root) / f"class{c}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            arr = (torch.rand(size, size, 3, generator=g) * 80).to(torch.uint8)
            arr[..., c] += 120
            Image.fromarray(arr.numpy()).save(d / f"{i}.png")
    return Path(root)


def write_text_files(directory: Path, docs: list[str], name: str) -> dict[str, Path]:
    """The same documents as .txt (joined by blank lines), .jsonl, .json, .csv and .parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    out = {
        "txt": directory / f"{name}.txt",
        "jsonl": directory / f"{name}.jsonl",
        "json": directory / f"{name}.json",
        "csv": directory / f"{name}.csv",
        "parquet": directory / f"{name}.parquet",
    }
    out["txt"].write_text("\n\n".join(docs) + "\n")
    out["jsonl"].write_text("".join(json.dumps({"text": d, "label": i % 3}) + "\n" for i, d in enumerate(docs)))
    out["json"].write_text(json.dumps([{"text": d, "label": i % 3} for i, d in enumerate(docs)]))
    import csv

    with open(out["csv"], "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i, d in enumerate(docs):
            w.writerow([d, i % 3])
    pq.write_table(pa.table({"text": docs, "label": [i % 3 for i in range(len(docs))]}), out["parquet"])
    return out


def cache_dataset(
    cache: Path,
    repo_id: str,
    splits: dict[str, list[str]],
    *,
    config: str = "default",
    commit: str = "c0ffee" * 6 + "c0de",
) -> Path:
    """``repo_id`` (``org/name``) with ``splits`` (split -> texts, column ``text``) in a datasets
    cache folder ``cache``, laid out as ``datasets.load_dataset(repo_id, config)`` leaves it
    (``org___name/CONFIG/0.0.0/COMMIT/`` with Arrow files and ``dataset_info.json``), so that
    ``HF_DATASETS_OFFLINE=1`` reads it back. Built by the ``parquet`` builder from Parquet files of
    the texts, then moved to the repository's name; returns the folder."""
    import shutil
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets.packaged_modules.parquet.parquet import Parquet

    org, name = repo_id.split("/") if "/" in repo_id else (None, repo_id)
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for split, texts in splits.items():
            files[split] = str(Path(tmp) / f"{split}.parquet")
            pq.write_table(pa.table({"text": list(texts)}), files[split])
        builder = Parquet(
            cache_dir=str(Path(tmp) / "c"),
            dataset_name=name,
            config_name=config,
            config_id=config,
            data_files=files,
            hash=commit,
        )
        builder.download_and_prepare()
        target = Path(cache) / (f"{org}___{name}" if org else name) / config / "0.0.0" / commit
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(target, ignore_errors=True)
        shutil.move(builder.cache_dir, target)
    return target


def hub_put(cache: Path, repo_id: str, source: Path, commit: str, refs: tuple[str, ...] = ("main",)) -> Path:
    """``source``'s files as a snapshot of ``repo_id`` in the hub cache ``cache``, laid out as
    ``hf download`` leaves it: blobs named by their SHA-256, a snapshot folder of relative symlinks
    to them, and each ref a file holding the commit. Returns the snapshot folder."""
    import hashlib
    import os

    folder = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    snap = folder / "snapshots" / commit
    snap.mkdir(parents=True)
    (folder / "blobs").mkdir(exist_ok=True)
    (folder / "refs").mkdir(exist_ok=True)
    for f in sorted(Path(source).iterdir()):
        data = f.read_bytes()
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        if not blob.exists():
            blob.write_bytes(data)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    for ref in refs:
        (folder / "refs" / ref).write_text(commit)
    return snap


def tiny_llama(layers: int = 4):
    """A seeded LLaMA (width 32, 2 heads, 1 key/value head, vocabulary 96) for the offload tests."""
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return tf.LlamaForCausalLM(cfg).eval()


def state_bytes(model) -> int:
    """Bytes of a model's state dict (its weights and buffers)."""
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())
