"""The tiny Hugging Face Llama-style configuration the decode tests share:
2 layers, hidden 64, 4 query and 2 key/value heads, a 256-token vocabulary,
built from a config with random weights (nothing downloaded)."""

VOCAB = 256
CONFIG = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    tie_word_embeddings=False,
)
