"""The torch model: blocks, RoPE, chunked loss and Hugging Face weight names."""
