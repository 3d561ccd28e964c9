"""What the published Qwen-Omni checkpoints hold: their ``config.json``, processor, tokenizer and generation files,
as data, at full depth. Stand-ins (:mod:`~relax_gym.trainer.models.standin`) are written from it with the depth cut;
the size report (:mod:`~relax_gym.trainer.models.sizes`) reads its widths.

Nothing here is downloaded. Where each figure comes from is in :data:`SOURCES` (and in docs/models.md):

- ``hf-file``: the published file itself, as quoted by public files that read or pin it against the real snapshot
  (Qwen2.5-Omni-7B: a checker pinned to HF revision ae9e1690; Qwen3-Omni-30B-A3B-Instruct: a config dump of HF
  revision 26291f79 with its per-tensor list);
- ``transformers``: transformers' config class defaults, which its docstrings name as the 7B's (Qwen2.5-Omni) —
  used where no copy of the file was found;
- ``qwen2.5-3b``: the 3B's text widths as quoted by third-party code "from HF config.json", its towers assumed
  equal to the 7B's with the output width set to the 3B's hidden size (the towers are shared across sizes);
- ``reconstructed``: written by us to the family's pattern where no copy was found (generation configs, the Qwen3
  chat template, some added tokens): behaviour-compatible, not byte-identical.

Raw files use transformers-4.5x spellings (``rope_scaling``, ``torch_dtype``, ``*_token_index``), as published;
transformers 5 reads them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PUBLISHED", "PublishedModel", "SOURCES", "published_config", "thinker_text_config"]


# -- Qwen2.5-Omni ------------------------------------------------------------------------------------------------

_Q25_SPECIAL: tuple[tuple[str, int, bool], ...] = (
    ("<|endoftext|>", 151643, True), ("<|im_start|>", 151644, True), ("<|im_end|>", 151645, True),
    ("<|AUDIO|>", 151646, True), ("<|audio_bos|>", 151647, True), ("<|audio_eos|>", 151648, True),
    ("<|box_end|>", 151649, True), ("<|quad_start|>", 151650, True), ("<|quad_end|>", 151651, True),
    ("<|vision_bos|>", 151652, True), ("<|vision_eos|>", 151653, True), ("<|vision_pad|>", 151654, True),
    ("<|IMAGE|>", 151655, True), ("<|VIDEO|>", 151656, True), ("<tool_call>", 151657, False),
    ("</tool_call>", 151658, False), ("<|fim_prefix|>", 151659, False), ("<|fim_middle|>", 151660, False),
    ("<|fim_suffix|>", 151661, False), ("<|fim_pad|>", 151662, False), ("<|repo_name|>", 151663, False),
    ("<|file_sep|>", 151664, False),
)

_Q25_MEDIA_TOKENS = {
    "audio_token": "<|AUDIO|>", "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>",
    "image_token": "<|IMAGE|>", "video_token": "<|VIDEO|>", "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
}

# The published Qwen2.5-Omni chat template (verbatim; default system prompt "You are a helpful assistant.").
_Q25_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}{% set image_count = namespace(value=0) %}{% set video_count = "
    "namespace(value=0) %}{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}{% for content in "
    "message['content'] %}{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_bos|><|IMAGE|><|vision_eos|>{% elif content['type'] == 'audio' or 'audio' in content or "
    "'audio_url' in content %}{% set audio_count.value = audio_count.value + 1 %}{% if add_audio_id %}Audio "
    "{{ audio_count.value }}: {% endif %}<|audio_bos|><|AUDIO|><|audio_eos|>{% elif content['type'] == 'video' or "
    "'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_bos|><|VIDEO|><|vision_eos|>{% elif 'text' in content %}"
    "{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}"
)


def _q25_config(*, hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, vocab: int,
                tied: bool, talker_embedding: int) -> dict[str, Any]:
    """A Qwen2.5-Omni ``config.json`` (thinker, talker, token2wav) for one size; towers as in the 7B."""
    rope = {"mrope_section": [16, 24, 24], "rope_type": "default", "type": "default"}
    return {
        "architectures": ["Qwen2_5OmniModel"],
        "enable_audio_output": True,
        "enable_talker": True,
        "model_type": "qwen2_5_omni",
        "torch_dtype": "bfloat16",
        "transformers_version": "4.50.0.dev0",
        "thinker_config": {
            "model_type": "qwen2_5_omni_thinker",
            "audio_token_index": 151646, "image_token_index": 151655, "video_token_index": 151656,
            "audio_start_token_id": 151647, "audio_end_token_id": 151648,
            "vision_start_token_id": 151652, "vision_end_token_id": 151653,
            "bos_token_id": 151644, "eos_token_id": 151645, "pad_token_id": 151643, "user_token_id": 872,
            "ignore_index": -100, "init_std": 0.02, "initializer_range": 0.02,
            "position_id_per_seconds": 25, "seconds_per_chunk": 2,
            "torch_dtype": "bfloat16",
            "text_config": {
                "model_type": "qwen2_5_omni_text", "vocab_size": vocab, "hidden_size": hidden,
                "intermediate_size": intermediate, "num_hidden_layers": layers, "num_attention_heads": heads,
                "num_key_value_heads": kv_heads, "hidden_act": "silu", "max_position_embeddings": 32768,
                "max_window_layers": layers, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "rope_scaling": rope,
                "sliding_window": 32768, "use_sliding_window": False, "use_cache": True,
                "tie_word_embeddings": tied, "attention_dropout": 0.0, "init_std": 0.02, "torch_dtype": "bfloat16",
            },
            "vision_config": {
                "model_type": "qwen2_5_omni_vision_encoder", "depth": 32, "embed_dim": 1280, "hidden_size": 1280,
                "intermediate_size": 3420, "num_heads": 16, "out_hidden_size": hidden, "patch_size": 14,
                "spatial_patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112,
                "fullatt_block_indexes": [7, 15, 23, 31], "in_channels": 3, "in_chans": 3, "hidden_act": "silu",
                "tokens_per_second": 25, "init_std": 0.02, "torch_dtype": "bfloat16",
            },
            "audio_config": {
                "model_type": "qwen2_5_omni_audio_encoder", "d_model": 1280, "encoder_layers": 32,
                "num_hidden_layers": 32, "encoder_attention_heads": 20, "encoder_ffn_dim": 5120,
                "num_mel_bins": 128, "max_source_positions": 1500, "n_window": 100, "output_dim": hidden,
                "activation_function": "gelu", "activation_dropout": 0.0, "attention_dropout": 0.0, "dropout": 0.0,
                "encoder_layerdrop": 0.0, "scale_embedding": False, "init_std": 0.02, "torch_dtype": "bfloat16",
            },
        },
        "talker_config": {
            "model_type": "qwen2_5_omni_talker", "vocab_size": 8448, "embedding_size": talker_embedding,
            "hidden_size": 896, "intermediate_size": 18944, "num_hidden_layers": 24, "num_attention_heads": 12,
            "num_key_value_heads": 4, "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 32768,
            "max_window_layers": 28, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
            "rope_scaling": {"mrope_section": [16, 16, 0], "rope_type": "default", "type": "default"},
            "sliding_window": 32768, "use_sliding_window": False, "use_cache": True,
            "audio_token_index": 151646, "image_token_index": 151655, "video_token_index": 151656,
            "audio_start_token_id": 151647, "audio_end_token_id": 151648,
            "vision_start_token_id": 151652, "vision_end_token_id": 151653,
            "tts_text_start_token_id": 151860, "tts_text_end_token_id": 151861, "tts_text_pad_token_id": 151859,
            "tts_codec_start_token_id": 8293, "tts_codec_end_token_id": 8294, "tts_codec_pad_token_id": 8292,
            "tts_codec_mask_token_id": 8296, "position_id_per_seconds": 25, "seconds_per_chunk": 2,
            "spatial_merge_size": 2, "init_std": 0.02, "torch_dtype": "bfloat16",
        },
        "token2wav_config": {
            "model_type": "qwen2_5_omni_token2wav",
            "dit_config": {
                "model_type": "qwen2_5_omni_dit", "dim": 1024, "hidden_size": 1024, "depth": 22,
                "num_hidden_layers": 22, "heads": 16, "num_attention_heads": 16, "head_dim": 64, "ff_mult": 2,
                "emb_dim": 512, "mel_dim": 80, "num_embeds": 8193, "repeats": 2, "block_size": 24,
                "look_ahead_layers": [10], "look_backward_layers": [0, 20], "dropout": 0.1,
                "enc_emb_dim": 192, "enc_dim": 128, "enc_channels": [256, 256, 256, 256, 768],
                "enc_kernel_sizes": [5, 3, 3, 3, 1], "enc_dilations": [1, 2, 3, 4, 1],
                "enc_attention_channels": 64, "enc_res2net_scale": 2, "enc_se_channels": 64,
                "max_position_embeddings": 32768, "rope_theta": 10000.0,
            },
            "bigvgan_config": {
                "model_type": "qwen2_5_omni_bigvgan", "mel_dim": 80, "upsample_initial_channel": 1536,
                "resblock_kernel_sizes": [3, 7, 11], "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
                "upsample_rates": [5, 3, 2, 2, 2, 2], "upsample_kernel_sizes": [11, 7, 4, 4, 4, 4],
            },
        },
    }


_Q25_PREPROCESSOR = {
    "chunk_length": 300, "dither": 0.0, "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 128,
    "hop_length": 160, "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "Qwen2VLImageProcessor", "image_std": [0.26862954, 0.26130258, 0.27577711],
    "max_pixels": 12845056, "merge_size": 2, "min_pixels": 3136, "n_fft": 400, "n_samples": 4800000,
    "nb_max_frames": 30000, "padding_side": "right", "padding_value": 0.0, "patch_size": 14,
    "processor_class": "Qwen2_5OmniProcessor", "return_attention_mask": True, "sampling_rate": 16000,
    "temporal_patch_size": 2,
}

_Q25_TOKENIZER_CONFIG = {
    "add_prefix_space": False, "bos_token": None, "clean_up_tokenization_spaces": False,
    "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 32768, "pad_token": "<|endoftext|>",
    "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    "processor_class": "Qwen2_5OmniProcessor", "extra_special_tokens": dict(_Q25_MEDIA_TOKENS),
}

_Q25_GENERATION = {"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
                   "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05,
                   "transformers_version": "4.50.0.dev0"}


# -- Qwen3-Omni ---------------------------------------------------------------------------------------------------

_Q3_SPECIAL: tuple[tuple[str, int, bool], ...] = (
    ("<|endoftext|>", 151643, True), ("<|im_start|>", 151644, True), ("<|im_end|>", 151645, True),
    ("<|object_ref_start|>", 151646, True), ("<|object_ref_end|>", 151647, True), ("<|box_start|>", 151648, True),
    ("<|box_end|>", 151649, True), ("<|quad_start|>", 151650, True), ("<|quad_end|>", 151651, True),
    ("<|vision_start|>", 151652, True), ("<|vision_end|>", 151653, True), ("<|vision_pad|>", 151654, True),
    ("<|image_pad|>", 151655, True), ("<|video_pad|>", 151656, True), ("<tool_call>", 151657, False),
    ("</tool_call>", 151658, False), ("<|fim_prefix|>", 151659, False), ("<|fim_middle|>", 151660, False),
    ("<|fim_suffix|>", 151661, False), ("<|fim_pad|>", 151662, False), ("<|repo_name|>", 151663, False),
    ("<|file_sep|>", 151664, False), ("<tool_response>", 151665, False), ("</tool_response>", 151666, False),
    ("<think>", 151667, False), ("</think>", 151668, False), ("<|audio_start|>", 151669, True),
    ("<|audio_end|>", 151670, True), ("<tts_pad>", 151671, True), ("<tts_text_bos>", 151672, True),
    ("<tts_text_eod>", 151673, True), ("<tts_text_bos_single>", 151674, True), ("<|audio_pad|>", 151675, True),
)

_Q3_MEDIA_TOKENS = {
    "audio_token": "<|audio_pad|>", "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>",
    "image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
}

# Qwen3-Omni's template follows Qwen3's (tools, reasoning content after the last user query) with media parts as
# <|vision_start|><|image_pad|><|vision_end|>, <|vision_start|><|video_pad|><|vision_end|> and
# <|audio_start|><|audio_pad|><|audio_end|>. Reconstructed: no verbatim copy was found. Like Qwen3's, it drops the
# <think> block of assistant turns before the last user query, so it is NOT append-only (`model check` says so).
_Q3_TEMPLATE = (
    "{%- set ns = namespace(last_query_index=messages|length - 1) -%}"
    "{%- for message in messages[::-1] -%}{%- set index = (messages|length - 1) - loop.index0 -%}"
    "{%- if message['role'] == 'user' and ns.last_query_index == messages|length - 1 -%}"
    "{%- set ns.last_query_index = index -%}{%- endif -%}{%- endfor -%}"
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}{%- set content = message['content'] -%}"
    "{%- else -%}{%- set content = namespace(text='') -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
    "{%- set content.text = content.text + '<|vision_start|><|image_pad|><|vision_end|>' -%}"
    "{%- elif part['type'] == 'video' or 'video' in part -%}"
    "{%- set content.text = content.text + '<|vision_start|><|video_pad|><|vision_end|>' -%}"
    "{%- elif part['type'] == 'audio' or 'audio' in part or 'audio_url' in part -%}"
    "{%- set content.text = content.text + '<|audio_start|><|audio_pad|><|audio_end|>' -%}"
    "{%- elif 'text' in part -%}{%- set content.text = content.text + part['text'] -%}{%- endif -%}"
    "{%- endfor -%}{%- set content = content.text -%}{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- set reasoning = '' -%}"
    "{%- if '</think>' in content -%}{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}"
    "{%- if loop.index0 > ns.last_query_index and reasoning -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content + '<|im_end|>\\n' -}}"
    "{%- else -%}{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)

_Q3_ROPE = {"interleaved": True, "mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default",
            "type": "default"}

_Q3_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3OmniMoeForConditionalGeneration"],
    "model_type": "qwen3_omni_moe",
    "enable_audio_output": True,
    "im_start_token_id": 151644, "im_end_token_id": 151645,
    "system_token_id": 8948, "user_token_id": 872, "assistant_token_id": 77091,
    "tts_pad_token_id": 151671, "tts_bos_token_id": 151672, "tts_eos_token_id": 151673,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.57.0.dev0",
    "thinker_config": {
        "model_type": "qwen3_omni_moe_thinker",
        "audio_token_id": 151675, "image_token_id": 151655, "video_token_id": 151656,
        "audio_start_token_id": 151669, "audio_end_token_id": 151670,
        "vision_start_token_id": 151652, "vision_end_token_id": 151653, "user_token_id": 872,
        "position_id_per_seconds": 13, "seconds_per_chunk": 2, "initializer_range": 0.02,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "qwen3_omni_moe_text", "vocab_size": 152064, "hidden_size": 2048,
            "intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
            "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 65536, "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0, "rope_scaling": dict(_Q3_ROPE), "sliding_window": None,
            "use_sliding_window": False, "use_cache": True, "attention_bias": False, "attention_dropout": 0.0,
            "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "norm_topk_prob": True, "shared_expert_intermediate_size": 0,
            "router_aux_loss_coef": 0.001, "output_router_logits": False, "tie_word_embeddings": False,
            "initializer_range": 0.02, "torch_dtype": "bfloat16",
        },
        "vision_config": {
            "model_type": "qwen3_omni_moe_vision_encoder", "depth": 27, "hidden_size": 1152,
            "intermediate_size": 4304, "num_heads": 16, "out_hidden_size": 2048, "patch_size": 16,
            "spatial_patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3,
            "in_chans": 3, "num_position_embeddings": 2304, "deepstack_visual_indexes": [8, 16, 24],
            "hidden_act": "gelu_pytorch_tanh", "image_size": 768, "apply_vit_abs_pos_embed": True,
            "tokens_per_second": 2, "initializer_range": 0.02, "torch_dtype": "bfloat16",
        },
        "audio_config": {
            "model_type": "qwen3_omni_moe_audio_encoder", "d_model": 1280, "encoder_layers": 32,
            "num_hidden_layers": 32, "encoder_attention_heads": 20, "encoder_ffn_dim": 5120, "num_mel_bins": 128,
            "max_source_positions": 1500, "n_window": 50, "n_window_infer": 800, "conv_chunksize": 500,
            "downsample_hidden_size": 480, "output_dim": 2048, "activation_function": "gelu",
            "activation_dropout": 0.0, "attention_dropout": 0.0, "dropout": 0.0, "scale_embedding": False,
            "initializer_range": 0.02, "torch_dtype": "bfloat16",
        },
    },
    "talker_config": {
        "model_type": "qwen3_omni_moe_talker",
        "thinker_hidden_size": 2048, "accept_hidden_layer": 24, "num_code_groups": 16,
        "audio_token_id": 151675, "image_token_id": 151655, "video_token_id": 151656,
        "vision_start_token_id": 151652, "audio_start_token_id": 151669, "audio_end_token_id": 151670,
        "position_id_per_seconds": 13, "seconds_per_chunk": 2, "spatial_merge_size": 2,
        "codec_pad_id": 2148, "codec_bos_id": 2149, "codec_eos_token_id": 2150, "codec_nothink_id": 2155,
        "codec_think_bos_id": 2156, "codec_think_eos_id": 2157,
        "speaker_id": {"chelsie": 2301, "ethan": 2302, "aiden": 2303},
        "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "qwen3_omni_moe_talker_text", "vocab_size": 3072, "hidden_size": 1024,
            "intermediate_size": 2048, "num_hidden_layers": 20, "num_attention_heads": 16, "num_key_value_heads": 2,
            "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 65536, "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0, "rope_scaling": dict(_Q3_ROPE), "num_experts": 128, "num_experts_per_tok": 6,
            "moe_intermediate_size": 384, "shared_expert_intermediate_size": 768, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "norm_topk_prob": True, "sliding_window": None, "use_sliding_window": False,
            "attention_bias": False, "torch_dtype": "bfloat16",
        },
        "code_predictor_config": {
            "model_type": "qwen3_omni_moe_talker_code_predictor", "vocab_size": 2048, "hidden_size": 1024,
            "intermediate_size": 3072, "num_hidden_layers": 5, "num_attention_heads": 16, "num_key_value_heads": 8,
            "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0, "num_code_groups": 16, "attention_bias": False, "torch_dtype": "bfloat16",
        },
    },
    "code2wav_config": {
        "model_type": "qwen3_omni_moe_code2wav", "codebook_size": 2048, "codebook_dim": 512, "decoder_dim": 1536,
        "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 8, "num_attention_heads": 16,
        "num_key_value_heads": 16, "sliding_window": 72, "rope_theta": 10000.0, "rms_norm_eps": 1e-05,
        "layer_scale_initial_scale": 0.01, "max_position_embeddings": 8000, "num_quantizers": 16,
        "num_semantic_quantizers": 1, "semantic_codebook_size": 4096, "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2], "vector_quantization_hidden_dimension": 512, "torch_dtype": "bfloat16",
    },
}

_Q3_PREPROCESSOR = {
    "chunk_length": 300, "dither": 0.0, "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 128,
    "hop_length": 160, "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Qwen2VLImageProcessor",
    "image_std": [0.5, 0.5, 0.5], "max_pixels": 12845056, "merge_size": 2, "min_pixels": 3136, "n_fft": 400,
    "n_samples": 4800000, "nb_max_frames": 30000, "padding_side": "right", "padding_value": 0.0, "patch_size": 16,
    "processor_class": "Qwen3OmniMoeProcessor", "return_attention_mask": True, "sampling_rate": 16000,
    "temporal_patch_size": 2,
}

_Q3_TOKENIZER_CONFIG = {
    "add_prefix_space": False, "bos_token": None, "clean_up_tokenization_spaces": False,
    "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 65536, "pad_token": "<|endoftext|>",
    "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    "processor_class": "Qwen3OmniMoeProcessor", "extra_special_tokens": dict(_Q3_MEDIA_TOKENS),
}

_Q3_GENERATION = {"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
                  "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
                  "transformers_version": "4.57.0.dev0"}


# -- the catalogue --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PublishedModel:
    """One published checkpoint's files, as data (full depth)."""

    name: str
    repo: str
    family: str  # PolicyConfig.family that trains it
    config: dict[str, Any]
    preprocessor: dict[str, Any]
    generation: dict[str, Any]
    special_tokens: tuple[tuple[str, int, bool], ...]  # (text, id, special) from id 151643 up
    tokenizer_config: dict[str, Any]
    chat_template: str
    shards: int  # model-0000k-of-0000N.safetensors: N
    video_preprocessor: dict[str, Any] | None = None  # none of the three ships one
    extra_files: tuple[str, ...] = ()  # published files a stand-in also writes (spk_dict.pt)
    # tensors stored in float32 whatever the checkpoint's dtype (name prefixes): Qwen2.5-Omni's vocoder -- the
    # published 7B index's total_size is its bf16 thinker and talker plus a float32 token2wav
    float32_parts: tuple[str, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)


PUBLISHED: dict[str, PublishedModel] = {
    "qwen2.5-omni-7b": PublishedModel(
        name="qwen2.5-omni-7b", repo="Qwen/Qwen2.5-Omni-7B", family="qwen2_5_omni",
        config=_q25_config(hidden=3584, intermediate=18944, layers=28, heads=28, kv_heads=4, vocab=152064,
                           tied=False, talker_embedding=3584),
        preprocessor=_Q25_PREPROCESSOR, generation=_Q25_GENERATION, special_tokens=_Q25_SPECIAL,
        tokenizer_config=_Q25_TOKENIZER_CONFIG, chat_template=_Q25_TEMPLATE, shards=5, extra_files=("spk_dict.pt",),
        float32_parts=("token2wav.",),
        sources={"config": "hf-file (thinker, talker, token2wav sizes); transformers (hidden_act, init_std)",
                 "preprocessor": "hf-file", "chat_template": "hf-file",
                 "special_tokens": "hf-file (11 of 22); reconstructed (box/quad/fim/tool_call ids, Qwen2.5 layout)",
                 "generation": "reconstructed", "shards": "hf-file (5 shards, 22,366,403,936 bytes: bf16 thinker and talker, float32 token2wav)"}),
    "qwen2.5-omni-3b": PublishedModel(
        name="qwen2.5-omni-3b", repo="Qwen/Qwen2.5-Omni-3B", family="qwen2_5_omni",
        config=_q25_config(hidden=2048, intermediate=11008, layers=36, heads=16, kv_heads=2, vocab=151936,
                           tied=False, talker_embedding=2048),
        preprocessor=_Q25_PREPROCESSOR, generation=_Q25_GENERATION, special_tokens=_Q25_SPECIAL,
        tokenizer_config=_Q25_TOKENIZER_CONFIG, chat_template=_Q25_TEMPLATE, shards=3, extra_files=("spk_dict.pt",),
        float32_parts=("token2wav.",),
        sources={"config": "qwen2.5-3b (text widths); 7B towers with output width 2048; tie_word_embeddings false "
                           "assumed (not confirmed)",
                 "preprocessor": "hf-file of the 7B (same family)", "chat_template": "hf-file (7B)",
                 "special_tokens": "as the 7B", "generation": "reconstructed", "shards": "hf-file (file list: 3 shards)"}),
    "qwen3-omni-30b-a3b": PublishedModel(
        name="qwen3-omni-30b-a3b", repo="Qwen/Qwen3-Omni-30B-A3B-Instruct", family="qwen3_omni_moe",
        config=_Q3_CONFIG, preprocessor=_Q3_PREPROCESSOR, generation=_Q3_GENERATION, special_tokens=_Q3_SPECIAL,
        tokenizer_config=_Q3_TOKENIZER_CONFIG, chat_template=_Q3_TEMPLATE, shards=15,
        sources={"config": "hf-file (config dump of revision 26291f79)", "preprocessor": "hf-file",
                 "special_tokens": "hf-file (media, tts and chat ids); reconstructed (Qwen3 layout for the rest)",
                 "chat_template": "reconstructed (Qwen3 pattern)", "generation": "reconstructed",
                 "shards": "hf-file (15 shards)"}),
}

#: Where each model's figures come from (docs/models.md prints this table).
SOURCES = {name: m.sources for name, m in PUBLISHED.items()}


def _cut_stack(cfg: dict[str, Any], keys: tuple[str, ...], layers: int) -> None:
    for key in keys:
        if key in cfg:
            cfg[key] = layers


def published_config(name: str, layers: int | None = None) -> dict[str, Any]:
    """The published ``config.json`` of ``name`` (a deep copy), every stack cut to ``layers`` when given.

    The cut keeps what the depth exercises: the text decoder and the audio tower get ``layers``; the vision tower
    gets ``max(layers, 2)`` blocks so that Qwen2.5-Omni's window attention (blocks outside
    ``fullatt_block_indexes``) and full attention (its last block) both run, and Qwen3-Omni's deepstack taps the
    first blocks; talker, code predictor and the vocoders get ``layers`` where they have a depth."""
    try:
        model = PUBLISHED[name]
    except KeyError:
        raise KeyError(f"unknown published model {name!r}; known: {', '.join(sorted(PUBLISHED))}") from None
    cfg = copy.deepcopy(model.config)
    if layers is None:
        return cfg
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    thinker = cfg["thinker_config"]
    _cut_stack(thinker["text_config"], ("num_hidden_layers", "max_window_layers"), layers)
    _cut_stack(thinker["audio_config"], ("encoder_layers", "num_hidden_layers"), layers)
    vision = thinker["vision_config"]
    depth = max(layers, 2)
    vision["depth"] = depth
    if "fullatt_block_indexes" in vision:
        vision["fullatt_block_indexes"] = [depth - 1]
    if "deepstack_visual_indexes" in vision:
        vision["deepstack_visual_indexes"] = list(range(min(depth, len(vision["deepstack_visual_indexes"]), layers)))
    talker = cfg.get("talker_config", {})
    _cut_stack(talker, ("num_hidden_layers", "max_window_layers"), layers)
    for sub in ("text_config", "code_predictor_config"):
        if sub in talker:
            _cut_stack(talker[sub], ("num_hidden_layers",), layers)
    if "token2wav_config" in cfg:
        dit = cfg["token2wav_config"]["dit_config"]
        _cut_stack(dit, ("depth", "num_hidden_layers"), layers)
        dit["look_ahead_layers"] = [i for i in dit["look_ahead_layers"] if i < layers]
        dit["look_backward_layers"] = [i for i in dit["look_backward_layers"] if i < layers]
    if "code2wav_config" in cfg:
        _cut_stack(cfg["code2wav_config"], ("num_hidden_layers",), layers)
    return cfg


def thinker_text_config(name: str) -> dict[str, Any]:
    """The full-depth text decoder config of ``name``'s thinker (what the size report and docs quote)."""
    return copy.deepcopy(PUBLISHED[name].config["thinker_config"]["text_config"])
