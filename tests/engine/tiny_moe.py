"""Write a tiny random-weight Qwen3-MoE model with its own tokenizer into a folder.

Run with the engine's Python (it has torch, transformers and tokenizers):
`python tests/engine/tiny_moe.py OUT_DIR`. Nothing is downloaded: the byte-level BPE tokenizer
is trained here on a few generated sentences, the weights are drawn from a fixed seed.
Shape: 2 layers, hidden 128, 8 experts, top-2, expert intermediate 64, vocabulary 1,024.
"""

import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3MoeConfig, Qwen3MoeForCausalLM

VOCAB_SIZE = 1024
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
# fmt: off
WORDS = (
    "the", "engine", "streams", "tokens", "while", "experts", "route", "each", "token", "to",
    "two", "of", "eight", "experts", "and", "the", "queue", "grows", "when", "the", "batch", "is",
    "full", "so", "the", "sweep", "raises", "concurrency", "until", "throughput", "stops",
)
# fmt: on


def make_tokenizer() -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    sentences = (
        " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(12)) + f" {i}" for i in range(4000)
    )
    bpe.train_from_iterator(sentences, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    return tokenizer


def make_model() -> Qwen3MoeForCausalLM:
    config = Qwen3MoeConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=2048,
        bos_token_id=SPECIAL_TOKENS.index("<s>"),
        eos_token_id=SPECIAL_TOKENS.index("</s>"),
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(config).to(torch.bfloat16)


def main(out: str) -> None:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    make_model().save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)


if __name__ == "__main__":
    main(sys.argv[1])
