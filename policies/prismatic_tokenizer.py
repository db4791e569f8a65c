"""OpenVLA prompts and tokenizers: the prompt template, padded prompt ids, a tiny tokenizer.

:class:`PromptTokenizer` turns task descriptions into fixed-width id rows around a checkpoint's
tokenizer (loaded from its directory, never with remote code); :func:`tiny_tokenizer` is a
character-level stand-in for tiny instances with the same special tokens and action-id layout.
"""

from __future__ import annotations

import json

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["SPACE_TOKEN", "PromptTokenizer", "openvla_prompt", "tiny_tokenizer"]

SPACE_TOKEN = "\u2581"
"""SentencePiece's word-boundary piece. OpenVLA appends its id (29871 in Llama-2) after "Out:"
because training prompts had it there (``predict_action`` in the OpenVLA HF code)."""


def openvla_prompt(instruction: str) -> str:
    """OpenVLA's prompt (OpenVLA repo ``PurePromptBuilder``; REFERENCE.md openvla_v1)."""
    return f"In: What action should the robot take to {instruction.lower()}?\nOut:"


class PromptTokenizer:
    """Tokenises OpenVLA prompts into fixed-width, padded id rows.

    Each row is ``[<s>] + [pad] * k + prompt ids + [▁]`` of width ``1 + max_prompt_tokens``:
    padding sits right after ``<s>`` (where image patches are inserted), so every sample's patch
    embeddings and the end of its prompt are at the same positions. Rotary positions are
    recomputed from the validity mask, so a padded row computes what the unpadded one would.

    Args:
        tokenizer: a ``transformers`` tokenizer loaded from the checkpoint directory.
        max_prompt_tokens: T, prompt ids after ``<s>`` (including the ``▁`` suffix).

    Raises:
        ValueError: if the tokenizer has no BOS token.
    """

    def __init__(self, tokenizer: Any, max_prompt_tokens: int):
        self.tokenizer = tokenizer
        self.max_prompt_tokens = int(max_prompt_tokens)
        if tokenizer.bos_token_id is None:
            raise ValueError("The checkpoint's tokenizer has no BOS token (<s>).")
        self.bos_id = int(tokenizer.bos_token_id)
        space = tokenizer.convert_tokens_to_ids(SPACE_TOKEN)
        unk = tokenizer.unk_token_id
        self.suffix_ids = [int(space)] if space is not None and space != unk else []
        self.eos_id = int(tokenizer.eos_token_id) if tokenizer.eos_token_id is not None else 2

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, max_prompt_tokens: int) -> PromptTokenizer:
        """Load the tokenizer files of a checkpoint directory (never with remote code).

        Raises:
            FileNotFoundError: if the directory has no tokenizer files.
        """
        from transformers import AutoTokenizer

        p = Path(path)
        if not any((p / n).exists() for n in ("tokenizer.json", "tokenizer.model")):
            raise FileNotFoundError(
                f"No tokenizer.json or tokenizer.model in {p}; copy the tokenizer files of the "
                "checkpoint into that directory."
            )
        kw = {}
        tc = p / "tokenizer_config.json"
        if tc.is_file() and json.loads(tc.read_text()).get("tokenizer_class"):
            from transformers import PretrainedConfig

            # the class is named: AutoTokenizer need not read the VLA's config.json, whose
            # model_type (openvla) transformers does not know and warns about on every load
            kw["config"] = PretrainedConfig()
        tok = AutoTokenizer.from_pretrained(str(p), trust_remote_code=False, **kw)
        return cls(tok, max_prompt_tokens)

    def __call__(self, instructions: Sequence[str], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokenise a batch.

        Args:
            instructions: N task descriptions (lower-cased inside the prompt).
            device: where the tensors go.

        Returns:
            ``(ids (N, 1 + T) int64, valid (N, 1 + T) bool)``.

        Raises:
            ValueError: if a prompt is longer than T (names the config field to raise).
        """
        width = self.max_prompt_tokens
        ids = torch.full((len(instructions), 1 + width), self.bos_id, dtype=torch.long)
        valid = torch.zeros(ids.shape, dtype=torch.bool)
        valid[:, 0] = True
        for i, text in enumerate(instructions):
            body = self.tokenizer(openvla_prompt(text), add_special_tokens=False)["input_ids"]
            body = list(body) + self.suffix_ids
            if len(body) > width:
                raise ValueError(
                    f"Prompt for {text!r} has {len(body)} tokens > policy.max_prompt_tokens="
                    f"{width}; raise policy.max_prompt_tokens."
                )
            ids[i, 1 + width - len(body) :] = torch.tensor(body, dtype=torch.long)
            valid[i, 1 + width - len(body) :] = True
        return ids.to(device), valid.to(device)


def tiny_tokenizer(base_vocab: int, words: Sequence[str] = ()) -> Any:
    """A character-level tokenizer for tiny instances, as a ``transformers`` fast tokenizer.

    Ids: ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, ``▁`` 3, newline and printable ASCII, then reserved
    ``<extra_i>`` tokens up to ``base_vocab`` (the last 256 are the action tokens, as in Llama-2
    where they are rarely used pieces) and ``<PAD>`` = ``base_vocab``. ``save_pretrained`` writes
    ``tokenizer.json`` + ``tokenizer_config.json``, loadable with ``AutoTokenizer`` like the
    real Llama-2 tokenizer files.

    Args:
        base_vocab: V, ids below the ``<PAD>`` id.
        words: whole words that become single tokens, alone and with a leading space (BPE
            merges through each word's prefixes, in the ids after the characters); other text
            stays character-level. OpenVLA's prompt with a ManiSkill instruction then takes
            about 20 ids instead of about 80.

    Raises:
        ValueError: if ``base_vocab`` cannot hold the characters, the words' pieces and 256
            action ids.
    """
    from tokenizers import Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, SPACE_TOKEN: 3}
    for ch in ["\n"] + [chr(c) for c in range(32, 127)]:
        vocab[ch] = len(vocab)
    merges = []
    # space-prefixed words first: BPE applies the lowest-ranked merges first
    for word in dict.fromkeys([" " + w for w in words] + list(words)):
        for i in range(2, len(word) + 1):
            if word[:i] not in vocab:
                merges.append((word[: i - 1], word[i - 1]))
                vocab[word[:i]] = len(vocab)
    if len(vocab) + 256 > base_vocab:
        raise ValueError(f"base_vocab {base_vocab} too small for {len(vocab)} text ids + 256 actions.")
    while len(vocab) < base_vocab:
        vocab[f"<extra_{len(vocab)}>"] = len(vocab)
    vocab["<PAD>"] = base_vocab
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)]
    )
    tok.decoder = decoders.Fuse()  # pieces carry their own spaces: decode(encode(x)) == x
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<PAD>", model_max_length=2048,
    )
