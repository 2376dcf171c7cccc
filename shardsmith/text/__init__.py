"""What only text uses: tokenizers and their folders (``tokenize``, ``tokenizer_folder``,
``tokenizer_class``), the processors that turn documents and conversations into token ids
(``token_processor``, ``chat_processor``), chat records and templates rendered in a sandbox under
bounds (``chat*``), and cleaning: normalization, word n-grams, MinHash and decontamination
(``textnorm``, ``textnorm_batch``, ``ngrams``, ``minhash``, ``decontaminate``, ``cleaning``).

Imports only errors, core, storage and kit; kit and core never import it. The engine reaches it at
one seam, ``text.cleaning`` (its document-cleaning stage: ``--dedup``, ``--decontaminate``,
``--provenance``), and the commands (``pack-tokens``, ``convert``'s text options) and the tokens
format's chat report section use it from above (docs/design.md, "Layers").
"""
