"""Decoder-only `transformers` models from tiny configs: random weights, nothing fetched.

Dropout is 0 so that a run is a function of its seed and data order alone (the FSDP and DDP
loss curves of the example's test then differ by float rounding only).
"""

from __future__ import annotations

from torch import nn

from causal_lm.text import VOCAB_SIZE

NEWLINE = ord("\n")
"""Begin and end of a sentence (a line), in place of GPT-2's id 50256, outside 256 bytes."""


def tiny_gpt2(d_model: int = 64, layers: int = 2, heads: int = 2, context: int = 64,
              vocab_size: int = VOCAB_SIZE) -> nn.Module:
    """``GPT2LMHeadModel`` (tied input and output embeddings; FSDP units: its ``GPT2Block``)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=vocab_size, n_positions=context, n_embd=d_model,
                        n_layer=layers, n_head=heads, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, bos_token_id=NEWLINE,
                        eos_token_id=NEWLINE)
    return GPT2LMHeadModel(config)


def tiny_llama(d_model: int = 64, layers: int = 2, heads: int = 2, context: int = 64,
               vocab_size: int = VOCAB_SIZE) -> nn.Module:
    """``LlamaForCausalLM`` (RoPE, RMSNorm, SwiGLU; FSDP units: its ``LlamaDecoderLayer``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=d_model, intermediate_size=
                         4 * d_model, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=heads, max_position_embeddings=context,
                         attention_dropout=0.0, tie_word_embeddings=False,
                         bos_token_id=NEWLINE, eos_token_id=NEWLINE)
    return LlamaForCausalLM(config)
