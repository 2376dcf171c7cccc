"""transformers 5.24's own tables, as shardsmith keeps them to choose the tokenizer class
AutoTokenizer picks for a folder (``text/tokenizer_class.py``); tests/test_chat_tokenizer_class.py
checks them against the installed transformers (the dev extra pins 5.24.0), so moving the pin to a
release that changes them fails there first."""

from __future__ import annotations

# tokenizer_class names (less a "Fast" suffix) whose class loads tokenizer.json as it is: TokenizersBackend
# (PreTrainedTokenizerFast), the Python backend it stands in for, and subclasses without an __init__ of their own
AS_IS = frozenset("""
    BloomTokenizer ConvBertTokenizer FNetTokenizer ParakeetTokenizer PreTrainedTokenizer PythonBackend
    TokenizersBackend
""".split())  # noqa: SIM905

# the tokenizer class transformers registers for each model_type of config.json
MODEL_TYPES = {
    "AlbertTokenizer": "albert yoso",
    "BartTokenizer": "florence2",
    "BarthezTokenizer": "barthez",
    "BartphoTokenizer": "bartpho",
    "BertJapaneseTokenizer": "bert-japanese",
    "BertTokenizer": (
        "align bark bert blip bros chinese_clip convbert distilbert electra ernie flava "
        "git grounding-dino layoutlm megatron-bert mm-grounding-dino nezha nomic_bert "
        "qdqbert realm retribert squeezebert tvp vilt visual_bert"
    ),
    "BertweetTokenizer": "bertweet",
    "BigBirdTokenizer": "big_bird",
    "BioGptTokenizer": "biogpt",
    "BlenderbotSmallTokenizer": "blenderbot-small",
    "BlenderbotTokenizer": "blenderbot",
    "ByT5Tokenizer": "byt5",
    "CLIPTokenizer": (
        "aimv2 clip clipseg groupvit omdet-turbo oneformer owlv2 owlvit sam3 sam3_video "
        "xclip"
    ),
    "CTRLTokenizer": "ctrl",
    "CamembertTokenizer": "camembert",
    "CanineTokenizer": "canine",
    "ClvpTokenizer": "clvp",
    "CodeLlamaTokenizer": "code_llama",
    "CohereTokenizer": "aya_vision cohere cohere2",
    "CpmAntTokenizer": "cpmant",
    "CpmTokenizer": "cpm",
    "DPRQuestionEncoderTokenizer": "dpr",
    "DebertaTokenizer": "deberta",
    "DebertaV2Tokenizer": "deberta-v2",
    "DiaTokenizer": "dia",
    "EsmTokenizer": "esm",
    "EsmcTokenizer": "esmc esmfold2",
    "FNetTokenizer": "fnet",
    "FSMTTokenizer": "fsmt",
    "FlaubertTokenizer": "flaubert",
    "FunnelTokenizer": "funnel",
    "GPT2Tokenizer": (
        "blip-2 codegen dbrx emu3 gpt2 gpt_neo gptj hyperclovax_vision_v2 instructblip "
        "instructblipvideo jais2 opt phi starcoder2"
    ),
    "GPTNeoXJapaneseTokenizer": "gpt_neox_japanese",
    "GPTNeoXTokenizer": "falcon_mamba gpt_neox mamba mamba2 mpt olmo olmoe rwkv xlstm",
    "GemmaTokenizer": (
        "diffusion_gemma gemma gemma2 gemma3 gemma3_text gemma3n gemma3n_text "
        "recurrent_gemma shieldgemma2 t5gemma zaya"
    ),
    "HerbertTokenizer": "herbert",
    "LEDTokenizer": "led",
    "LasrTokenizer": "lasr_ctc lasr_encoder",
    "LayoutLMv2Tokenizer": "layoutlmv2",
    "LayoutLMv3Tokenizer": "layoutlmv3",
    "LayoutXLMTokenizer": "layoutxlm",
    "LlamaTokenizer": "idefics idefics2",
    "LukeTokenizer": "luke",
    "LxmertTokenizer": "lxmert",
    "MBart50Tokenizer": "mbart50",
    "MBartTokenizer": "mbart",
    "MPNetTokenizer": "mpnet",
    "MarkupLMTokenizer": "markuplm",
    "MgpstrTokenizer": "mgp-str",
    "MobileBertTokenizer": "mobilebert",
    "MvpTokenizer": "mvp",
    "MyT5Tokenizer": "myt5",
    "NllbTokenizer": "nllb nllb-moe",
    "NougatTokenizer": "nougat pp_formulanet",
    "OpenAIGPTTokenizer": "openai-gpt",
    "PLBartTokenizer": "plbart",
    "ParakeetTokenizer": (
        "granite_speech5_ctc nemotron3_5_asr nemotron_asr_streaming omniasr_ctc "
        "parakeet_ctc parakeet_rnnt parakeet_tdt"
    ),
    "PegasusTokenizer": "pegasus",
    "PerceiverTokenizer": "perceiver",
    "PhobertTokenizer": "phobert",
    "ProphetNetTokenizer": "prophetnet",
    "Qwen2Tokenizer": (
        "audioflamingo3 colqwen2 cosmos3_omni dots3_note fun_asr_nano hunyuan_vl internvl "
        "moss_transcribe_diarize ovis2 qianfan_ocr qwen2 qwen2_5_omni qwen2_5_vl "
        "qwen2_audio qwen2_moe qwen2_vl qwen3 qwen3_asr qwen3_moe qwen3_next "
        "qwen3_omni_moe qwen3_vl qwen3_vl_moe"
    ),
    "Qwen2TokenizerFast": "lighton_ocr vibevoice",
    "Qwen3_5Tokenizer": "qwen3_5 qwen3_5_moe qwen3_5_moe_text qwen3_5_text qwen4_exp",
    "RagTokenizer": "rag",
    "ReformerTokenizer": "reformer",
    "RemBertTokenizer": "rembert",
    "RoCBertTokenizer": "roc_bert",
    "RoFormerTokenizer": "roformer",
    "RobertaTokenizer": (
        "bart bridgetower clap data2vec-text ibert lilt longformer mega mra roberta "
        "roberta-prelayernorm"
    ),
    "SeamlessM4TTokenizer": "seamless_m4t seamless_m4t_v2",
    "Siglip2Tokenizer": "siglip2",
    "SplinterTokenizer": "splinter",
    "T5Tokenizer": "mt5 musicgen musicgen_melody switch_transformers t5",
    "TapasTokenizer": "tapas",
    "TokenizersBackend": (
        "EvollaModel arctic aria beam bigbird_pegasus camembertv2-base canary chatlm "
        "cohere_asr ernie4_5 ernie4_5_moe flex_olmo fuyu glm glm4 glm4_moe glm4_moe_lite "
        "glm4v glm4v_moe glm_image glmasr got_ocr2 gpt_bigcode gradium_phonon_tts granite "
        "granitemoe granitemoehybrid granitemoeshared h2ovl_chat hyperclovax "
        "hyperclovax_vlm internlm2 internlm3 iquestcoder jamba kimi_k25 kimi_linear "
        "kosmos-2 llava llava_next mimo_v2_flash minicpm3 minicpm_ocr minicpmv "
        "minicpmv4_6 minicpmv4_7 minimax_m2 ministral ministral3 mistral mistral3 "
        "mistral_large4 mixtral modernbert modernbert-decoder molmo molmo2 nemo_speechlm "
        "nemotron nvfp4 nystromformer olmo2 olmo3 olmo_hybrid omniasr opencua openvla "
        "paddleocr_vl pegasus_x persimmon phi3 phi3_v phimoe pix2struct pixtral "
        "pocket_tts smolvlm stablelm step3_vl umt5 vipllava voxtral voxtral_realtime "
        "xlm-roberta-xl"
    ),
    "UdopTokenizer": "udop",
    "VideoPrismTokenizer": "videoprism",
    "VitsTokenizer": "vits",
    "Wav2Vec2CTCTokenizer": (
        "data2vec-audio hubert unispeech unispeech-sat wav2vec2 wav2vec2-bert "
        "wav2vec2-conformer"
    ),
    "Wav2Vec2PhonemeCTCTokenizer": "wav2vec2_phoneme",
    "WhisperTokenizer": "whisper",
    "XGLMTokenizer": "xglm",
    "XLMRobertaTokenizer": "gte jina_embeddings_v3 metaclip_2 trocr xlm-roberta xmod",
    "XLMTokenizer": "xlm",
    "XLNetTokenizer": "xlnet",
}

# model types whose tokenizer_class on the Hub transformers overrides with the registered one
INCORRECT_HUB_CLASS = frozenset("""
    arctic camembertv2-base chatlm cohere_asr ernie4_5 ernie4_5_moe fuyu h2ovl_chat hyperclovax
    hyperclovax_vision_v2 hyperclovax_vlm internlm2 internlm3 iquestcoder jamba llava llava_next
    minicpm3 minicpmv minimax_m2 modernbert modernbert-decoder molmo molmo2 nemotron nvfp4 opencua
    openvla paddleocr_vl phi3 phi3_v phimoe qwen2 qwen3_5 qwen3_5_moe qwen3_5_moe_text qwen4_exp siglip2
    smolvlm step3_vl vipllava
""".split())  # noqa: SIM905
