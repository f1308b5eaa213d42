"""Deterministic generator of the tiny models (`tiny-llama`, `tiny-llama-draft`, one `tiny-<family>` per further
family, and the EAGLE-3 head `tiny-llama-eagle3` via `tiny_eagle3`) in the Hub's format.

A byte-level BPE tokenizer is trained on the bundled corpus (`pipeline/data/corpus.txt`), then each model is
initialised from a fixed seed and trained briefly on the corpus' calibration split, single-threaded so the bytes
are reproducible. Architecture numbers come from the packaged registry (`models.yaml`). Results are cached under
`cache_dir()/generated/<name>-<GENERATOR_VERSION>/`, written atomically under a file lock; the libraries' output
while generating goes to `cache_dir()/logs/generate-<name>-<GENERATOR_VERSION>.log`.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

from pipeline.core.artifacts import atomic_dir, cache_dir, file_table, is_current, stage_key, stage_lock
from pipeline.core.errors import DownloadError
from pipeline.core.manifests import GeneratedManifest
from pipeline.core.registry import load_registry
from pipeline.core.stage_log import progress, stage_log
from pipeline.stages.download.tiny_corpus import (  # noqa: F401  (corpus_path, corpus_split: this module's API)
    GENERATOR_VERSION,
    as_chat,
    corpus_path,
    corpus_sha,
    corpus_split,
)

GENERATED_MODELS = ("tiny-llama", "tiny-llama-draft")  # the pair every test session trains
# one tiny model per further family, generated on demand (same tokenizer and training recipe)
GENERATED_FAMILY_MODELS = ("tiny-mistral", "tiny-mixtral", "tiny-qwen2", "tiny-qwen3")
# EAGLE-3 heads trained on a generated target (pipeline.stages.download.tiny_eagle3), generated on demand
GENERATED_HEADS = ("tiny-llama-eagle3",)

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
SPECIAL_TOKENS = (BOS, EOS, PAD, *ROLE_TOKENS)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

class TrainSettings(TypedDict):
    """The tiny model's training recipe."""

    seed: int
    steps: int
    batch_size: int
    seq_len: int
    lr: float
    warmup: int
    weight_decay: float
    init_std: float


# Training recipe (part of the cache key). Steps are fixed, not timed, so the result is deterministic.
TRAIN: TrainSettings = {"seed": 1234, "steps": 120, "batch_size": 8, "seq_len": 128, "lr": 3e-3, "warmup": 20,
                        "weight_decay": 0.01, "init_std": 0.02}


def train_tokenizer(texts: list[str], vocab_size: int):
    """Train the byte-level BPE tokenizer; returns a `transformers.PreTrainedTokenizerFast` with the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=list(ROLE_TOKENS),
        chat_template=CHAT_TEMPLATE,
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
        model_input_names=["input_ids", "attention_mask"],
    )


def _config(name: str, tokenizer):
    from transformers import CONFIG_MAPPING

    arch = load_registry()[name].architecture
    if len(tokenizer) > arch.vocab_size:
        raise DownloadError(f"tokenizer has {len(tokenizer)} tokens > vocab_size {arch.vocab_size} of {name}")
    family = arch.hf_config()  # the family's class, model_type and its own fields (sliding window, experts)
    extra = {k: v for k, v in family.items() if k in ("sliding_window", "num_local_experts", "num_experts_per_tok")}
    return CONFIG_MAPPING[family["model_type"]](
        **extra,
        vocab_size=arch.vocab_size,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        num_key_value_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        max_position_embeddings=arch.max_position_embeddings,
        rope_theta=arch.rope_theta,
        tie_word_embeddings=arch.tie_word_embeddings,
        hidden_act="silu",
        rms_norm_eps=1e-5,
        initializer_range=TRAIN["init_std"],
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        architectures=family["architectures"],
        dtype="bfloat16",
    )


@contextlib.contextmanager
def _deterministic_torch() -> Iterator[None]:
    """Single-threaded, deterministic torch for reproducible bytes; restores the previous settings."""
    import torch

    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det)


def _token_stream(tokenizer, texts: list[str]):
    import torch

    ids: list[int] = []
    for t in texts:
        ids.extend(tokenizer(as_chat(t))["input_ids"])  # BOS is added by the post-processor
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def _train(model, stream, steps: int, *, name: str = "tiny model") -> float:
    """Train `model` on random windows of `stream` for `steps` AdamW steps; returns the last loss."""
    import torch

    g = torch.Generator().manual_seed(TRAIN["seed"])
    bs, sl = TRAIN["batch_size"], TRAIN["seq_len"]
    opt = torch.optim.AdamW(model.parameters(), lr=TRAIN["lr"], weight_decay=TRAIN["weight_decay"],
                            betas=(0.9, 0.95))

    def lr_at(step: int) -> float:
        if step < TRAIN["warmup"]:
            return (step + 1) / TRAIN["warmup"]
        frac = (step - TRAIN["warmup"]) / max(1, steps - TRAIN["warmup"])
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    loss_val = float("nan")
    for _ in progress(range(steps), desc=f"generate {name}: training", unit="step"):
        starts = torch.randint(0, len(stream) - sl, (bs,), generator=g)
        batch = torch.stack([stream[s : s + sl] for s in starts.tolist()])
        out = model(input_ids=batch, labels=batch)  # the model shifts labels by one itself
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss_val = float(out.loss.detach())
    model.eval()
    return loss_val


def heldout_perplexity(model, tokenizer, texts: list[str], *, seq_len: int = 128) -> float:
    """Token-level perplexity of `model` over `texts` (concatenated, non-overlapping windows)."""
    import torch

    stream = _token_stream(tokenizer, texts)
    nll, count = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(stream) - 1, seq_len):
            chunk = stream[s : s + seq_len + 1].unsqueeze(0)
            if chunk.shape[1] < 2:
                break
            logits = model(input_ids=chunk[:, :-1]).logits.float()
            loss = torch.nn.functional.cross_entropy(logits[0], chunk[0, 1:], reduction="sum")
            nll += float(loss)
            count += chunk.shape[1] - 1
    return math.exp(nll / count)


def generation_key(name: str, *, steps: int | None = None) -> str:
    """Cache key of a generated model: generator version, recipe, corpus bytes, registry architecture."""

    arch = load_registry()[name].architecture
    recipe = dict(TRAIN, steps=TRAIN["steps"] if steps is None else steps)
    fields = {"generator": GENERATOR_VERSION, "name": name, "recipe": recipe, "corpus": corpus_sha(),
              "architecture": arch.model_dump(), "transformers_format": "4.57"}
    if name in GENERATED_HEADS:  # `steps` is the head's; its target is always the full one
        from pipeline.stages.download import tiny_eagle3

        fields.update(tiny_eagle3.head_key_fields(name, generation_key(tiny_eagle3.head_target(name))))
    return stage_key(fields)


def generate_tiny_model(name: str, out_dir: Path, *, steps: int | None = None) -> dict[str, Any]:
    """Write the HF-format model `name` into the (empty) directory `out_dir`; returns its manifest fields.

    `steps` overrides the number of training steps (tests of determinism use a short run).
    """
    import torch
    import transformers
    from transformers import GenerationConfig

    _check_generated(name)
    if name in GENERATED_HEADS:
        from pipeline.stages.download import tiny_eagle3

        target = ensure_tiny_model(tiny_eagle3.head_target(name))
        with _deterministic_torch():
            return tiny_eagle3.generate_head(name, Path(out_dir), target, steps=steps)
    steps = TRAIN["steps"] if steps is None else steps
    t0 = time.monotonic()
    calib, heldout = corpus_split()
    with _deterministic_torch():
        tokenizer = train_tokenizer(calib, load_vocab_size(name))
        config = _config(name, tokenizer)
        torch.manual_seed(TRAIN["seed"])
        model = getattr(transformers, config.architectures[0])(config).float()  # e.g. LlamaForCausalLM
        loss = _train(model, _token_stream(tokenizer, calib), steps, name=name) if steps else float("nan")
        ppl = heldout_perplexity(model, tokenizer, heldout)
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, do_sample=False,
    )
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return {
        "name": name,
        "generator_version": GENERATOR_VERSION,
        "train_steps": steps,
        "final_train_loss": round(loss, 4),
        "heldout_perplexity_fp32": round(ppl, 3),
        "seconds": round(time.monotonic() - t0, 1),
    }


def load_vocab_size(name: str) -> int:
    return load_registry()[name].architecture.vocab_size


def _check_generated(name: str) -> None:
    known = (*GENERATED_MODELS, *GENERATED_FAMILY_MODELS, *GENERATED_HEADS)
    if name not in known:
        raise DownloadError(f"no generator for model '{name}'; generated models: {', '.join(known)}")


def model_dir(name: str) -> Path:
    return cache_dir() / "generated" / f"{name}-{GENERATOR_VERSION}"


def log_file(model_path: Path) -> Path:
    """Where the library output of generating the model at `model_path` goes: `cache_dir()/logs/generate-<dir>.log`."""
    return cache_dir() / "logs" / f"generate-{model_path.name}.log"


def ensure_tiny_model(name: str, *, steps: int | None = None) -> Path:
    """Return the cached HF-format directory of generated model `name`, generating it once if needed.

    Raises:
        DownloadError: `name` is not a generated model.
    """
    _check_generated(name)
    if name in GENERATED_HEADS:  # its target first, under its own lock and log
        from pipeline.stages.download.tiny_eagle3 import head_target

        ensure_tiny_model(head_target(name))
    final = model_dir(name) if steps is None else cache_dir() / "generated" / f"{name}-{GENERATOR_VERSION}-s{steps}"
    key = generation_key(name, steps=steps)
    if is_current(final, key):
        return final
    with stage_lock(final):
        if is_current(final, key):  # another process finished it while we waited
            return final
        with atomic_dir(final) as tmp, stage_log(log_file(final), title=f"generate {name} -> {final}"):
            info = generate_tiny_model(name, tmp, steps=steps)
            GeneratedManifest(key=key, **info, files=file_table(tmp)).write(tmp)
    return final
