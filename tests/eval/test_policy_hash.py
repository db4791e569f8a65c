"""The policy hash that eval results record (``policy.sha256``, one of the keys ``eval --resume``
matches before it appends trials) covers what a VLA checkpoint reads at load from outside
itself: the SFT directory of its ``pretrained`` field (weights layout, tokenizer, normalisation
statistics). Before, a re-made SFT under the same RL checkpoint hashed the same, so a resumed
evaluation could mix trials of two policies."""

from __future__ import annotations

import shutil

import pytest
from safetensors.torch import load_file, save_file
from rlinf_embodied.eval.policy_files import hash_files, hash_policy
from rlinf_embodied.policies import load_policy

from tests.policies.test_relocatable_checkpoints import sft_rl_run

pytestmark = pytest.mark.timeout(300)


def test_the_hash_covers_the_sft_directory_and_survives_a_move(tmp_path):
    run = tmp_path / "runs" / "a"
    sft_rl_run("pi0", run)
    ckpt = run / "rl" / "checkpoints" / "iter_000001" / "policy"
    policy = load_policy(ckpt)
    own, before = hash_files(ckpt), hash_policy(ckpt, policy.config)
    assert before != own  # the SFT directory is part of it

    # the same files elsewhere (mv of the whole run): the same hash
    moved = tmp_path / "runs" / "b"
    shutil.move(run, moved)
    ckpt = moved / "rl" / "checkpoints" / "iter_000001" / "policy"
    assert hash_policy(ckpt, load_policy(ckpt).config) == before

    # the SFT's normalisation statistics changed, the RL checkpoint's own files not
    vla = moved / "sft" / "vla"
    stats = next(vla.glob("policy_preprocessor_step_*_normalizer_processor.safetensors"))
    tensors = load_file(str(stats))
    save_file({k: v * 1.5 for k, v in tensors.items()}, str(stats))
    assert hash_files(ckpt) == own
    assert hash_policy(ckpt, load_policy(ckpt).config) != before


def test_a_checkpoint_that_reads_nothing_outside_hashes_as_its_files(tmp_path):
    run = tmp_path / "run"
    sft_rl_run("pi0", run)
    ckpt = run / "sft" / "policy"
    cfg = load_policy(ckpt).config
    # pretrained inside the checkpoint itself, or none at all: the checkpoint's own hash, which
    # results written before this hash recorded
    inside = type(cfg)(**{**cfg.__dict__, "pretrained": str(ckpt)})
    assert hash_policy(ckpt, inside) == hash_files(ckpt)
    none = type(cfg)(**{**cfg.__dict__, "pretrained": None})
    assert hash_policy(ckpt, none) == hash_files(ckpt)
