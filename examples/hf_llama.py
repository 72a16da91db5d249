"""A Llama-shaped transformers model (random weights, GQA 8:2) running attn-bench's sliding_window."""
import torch
from transformers import AutoModelForCausalLM

import attn.hf

config = attn.hf.tiny_config("llama")  # or transformers.AutoConfig.from_pretrained(<your checkpoint>)
name = attn.hf.register("sliding_window:window=1024")  # -> "attn_bench.sliding_window.window=1024"
model = AutoModelForCausalLM.from_config(config, attn_implementation=name).eval()
print(attn.hf.position_from_hf(config))  # ('rope', {'rope_theta': 10000.0, ...}): the checkpoint's RoPE, our name

prompt = torch.randint(0, config.vocab_size, (2, 40))
tokens = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False)
print(tokens.shape, attn.hf.attention_modules(model)[0].last_backend)  # (2, 48) blocked
