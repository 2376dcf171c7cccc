"""What the dataset card says of token shards: ``datasets`` has no builder for Megatron's
``.bin``/``.idx`` (nor nanoGPT's flat ``.bin``), so the card describes the documents and says which
readers take them."""

from __future__ import annotations

from typing import Any

from shardsmith.kit.format import CardData


def tokens_card(manifest: dict[str, Any]) -> CardData:
    tok = manifest.get("tokenizer") or {}
    dtype = str(tok.get("dtype", "uint16"))
    notes = [f"Each example is a document: its token ids ({dtype}; vocabulary of {tok.get('vocab_size')}"
             + (f", each document ends with `{tok['eos_token']}` = {tok.get('eos_id')}" if tok.get("eos_token") else "")
             + f"), tokenized with `{tok.get('path', 'tokenizer.json')}`.",
             "The shards are Megatron indexed datasets (`{split}-NNNNNN.bin` and `.idx`): megatron-core's "
             "`IndexedDataset(path_prefix)` reads each one."]
    if (chat := manifest.get("chat")) is not None:
        packed = manifest.get("packing") is not None
        notes[0] = (f"Each example is {'a packed sequence of whole conversations' if packed else 'a conversation'} "
                    f"rendered with the tokenizer's chat template (`tokenizer_config.json`): its token ids ({dtype}; "
                    f"vocabulary of {tok.get('vocab_size')}), tokenized with `{tok.get('path', 'tokenizer.json')}`.")
        notes.append(f"Beside each shard, `{{shard}}.mask.bin` holds one bit per token (`np.packbits` order): the "
                     f"tokens the loss counts (--train-on {chat.get('train_on')}: {chat.get('trained_tokens')} of "
                     f"{chat.get('tokens')}). `shardsmith.open(folder)[i]` gives `tokens` and `loss_mask`.")
    flat = [e["path"] for e in (manifest.get("nanogpt") or {}).values() if isinstance(e, dict)]
    if flat:
        notes.append(f"{' and '.join(f'`{p}`' for p in flat)}: nanoGPT's flat token files "
                     f"(`np.memmap(path, dtype=np.{dtype}, mode='r')`).")
    return CardData(features=[{"name": "tokens", "list": dtype}], notes=tuple(notes))
